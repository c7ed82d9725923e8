//! gRPC's length-prefixed messages on HTTP/2 for the services written against tonic's server
//! API (ADS in [`crate::grpc`], CSDS in [`crate::csds`]): requests decoded from a buffer
//! that holds only what has arrived, responses encoded each into a buffer of its own size.

use bytes::{Buf, Bytes, BytesMut};
use http_body::Frame;
use http_body_util::BodyExt;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use tokio_stream::Stream;
use tonic::Status;
use tonic::codegen::{Body, StdError, http};

/// A request buffer grown past this is released once drained.
pub const BUFFER_BYTES: usize = 1024;

/// The largest request accepted (gRPC's default receive limit).
const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;

/// gRPC's length-prefixed message header: a compression flag and a big-endian length.
const HEADER_BYTES: usize = 5;

/// Why no request could be had.
#[derive(Debug)]
pub(crate) enum RequestError {
    /// The client sent a request this server refuses (compressed, oversized, undecodable,
    /// cut short): the stream ends with this status, which says why.
    Refused(Status),
    /// The transport failed (the client reset the stream or the connection dropped).
    Transport(Status),
}

/// A stream's requests, decoded from its HTTP/2 body.
pub(crate) struct Requests<T> {
    body: Pin<Box<dyn Body<Data = Bytes, Error = Status> + Send>>,
    /// What has arrived and is not decoded yet.
    buf: BytesMut,
    ended: bool,
    _message: PhantomData<fn() -> T>,
}

impl<T: prost::Message + Default> Requests<T> {
    pub(crate) fn new<B>(body: B) -> Self
    where
        B: Body + Send + 'static,
        B::Error: Into<StdError> + Send + 'static,
    {
        let body = body
            .map_frame(|frame| frame.map_data(|mut data| data.copy_to_bytes(data.remaining())))
            .map_err(|e| Status::from_error(e.into()));
        Self {
            body: Box::pin(body),
            buf: BytesMut::new(),
            ended: false,
            _message: PhantomData,
        }
    }

    /// The next request; `None` once the client closed its side.
    pub(crate) async fn message(&mut self) -> Result<Option<T>, RequestError> {
        std::future::poll_fn(|cx| self.poll_message(cx)).await
    }

    fn poll_message(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<T>, RequestError>> {
        loop {
            if let Some(message) = self.take_message().map_err(RequestError::Refused)? {
                return Poll::Ready(Ok(Some(message)));
            }
            if self.ended {
                return Poll::Ready(if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(RequestError::Refused(Status::invalid_argument(
                        "the request stream ended inside a message",
                    )))
                });
            }
            match ready!(self.body.as_mut().poll_frame(cx)) {
                None => self.ended = true,
                Some(Err(status)) => return Poll::Ready(Err(RequestError::Transport(status))),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }

    /// Decodes the message at the head of the buffer, if it has all arrived.
    fn take_message(&mut self) -> Result<Option<T>, Status> {
        let Some(header) = self.buf.get(..HEADER_BYTES) else {
            return Ok(None);
        };
        if header[0] != 0 {
            return Err(Status::unimplemented(
                "compressed requests are not supported: send uncompressed messages",
            ));
        }
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        if len > MAX_REQUEST_BYTES {
            return Err(Status::resource_exhausted(format!(
                "a request of {len} bytes is over the limit of {MAX_REQUEST_BYTES}"
            )));
        }
        if self.buf.len() < HEADER_BYTES + len {
            self.buf.reserve(HEADER_BYTES + len - self.buf.len());
            return Ok(None);
        }
        self.buf.advance(HEADER_BYTES);
        let message =
            T::decode(&self.buf[..len]).map_err(|e| Status::invalid_argument(format!("decoding a request: {e}")))?;
        self.buf.advance(len);
        if self.buf.is_empty() && self.buf.capacity() > BUFFER_BYTES {
            self.buf = BytesMut::new();
        }
        Ok(Some(message))
    }
}

/// The refusal of a call whose messages are compressed: none is accepted (none is
/// advertised), as tonic says.
pub(crate) fn refuse_compressed(headers: &http::HeaderMap) -> Option<Status> {
    let enc = headers.get("grpc-encoding")?;
    (enc.as_bytes() != b"identity").then(|| {
        Status::unimplemented(format!(
            "grpc-encoding {:?} is not supported: send uncompressed messages",
            String::from_utf8_lossy(enc.as_bytes())
        ))
    })
}

pub(crate) fn encode<R: prost::Message>(message: &R) -> Result<Bytes, Status> {
    let len = message.encoded_len();
    let prefix = u32::try_from(len)
        .map_err(|_| Status::resource_exhausted(format!("a response of {len} bytes is too large to send")))?;
    let mut buf = Vec::with_capacity(HEADER_BYTES + len);
    buf.push(0);
    buf.extend_from_slice(&prefix.to_be_bytes());
    message
        .encode(&mut buf)
        .map_err(|e| Status::internal(format!("encoding a response: {e}")))?;
    Ok(Bytes::from(buf))
}

/// A stream of messages, each already encoded with its gRPC header, as gRPC's HTTP/2 body:
/// each message a frame that is freed once sent, then the status in trailers — `OK` when the
/// stream ends, or the error that ended it.
pub(crate) struct ResponseBody<S> {
    stream: Option<S>,
}

impl<S> ResponseBody<S>
where
    S: Stream<Item = Result<Bytes, Status>> + Unpin + Send + 'static,
{
    /// A gRPC response (`application/grpc`) whose body is `stream`.
    pub(crate) fn grpc(stream: S) -> http::Response<tonic::body::Body> {
        let mut http = http::Response::new(tonic::body::Body::new(ResponseBody { stream: Some(stream) }));
        http.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/grpc"),
        );
        http
    }
}

impl<S> ResponseBody<S> {
    fn trailers(status: &Status) -> Frame<Bytes> {
        let mut trailers = http::HeaderMap::new();
        if status.add_header(&mut trailers).is_err() {
            // The message could not be put in a header: the code alone still is.
            trailers.insert("grpc-status", http::HeaderValue::from(status.code() as i32));
        }
        Frame::trailers(trailers)
    }
}

impl<S> http_body::Body for ResponseBody<S>
where
    S: Stream<Item = Result<Bytes, Status>> + Unpin,
{
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let Some(stream) = self.stream.as_mut() else {
            return Poll::Ready(None);
        };
        let frame = match Pin::new(stream).poll_next(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Some(Ok(bytes))) => return Poll::Ready(Some(Ok(Frame::data(bytes)))),
            Poll::Ready(Some(Err(status))) => Self::trailers(&status),
            Poll::Ready(None) => Self::trailers(&Status::ok("")),
        };
        // Trailers end the body: the stream (and what it holds) goes now.
        self.stream = None;
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.stream.is_none()
    }
}

#[cfg(test)]
mod tests;
