use super::*;
use crate::XdsServer;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use http_body_util::StreamBody;
use prost::Message as _;
use std::convert::Infallible;
use tonic::Request;

fn framed(m: &DeltaDiscoveryRequest) -> Vec<u8> {
    let mut out = vec![0];
    out.extend_from_slice(&(m.encoded_len() as u32).to_be_bytes());
    m.encode(&mut out).unwrap();
    out
}

/// Requests over a body that delivers `chunks` as its data frames.
fn requests(chunks: Vec<Vec<u8>>) -> Requests<DeltaDiscoveryRequest> {
    let frames = chunks
        .into_iter()
        .map(|c| Ok::<_, Infallible>(Frame::data(Bytes::from(c))));
    Requests::new(StreamBody::new(futures_util::stream::iter(frames)))
}

fn request(type_url: &str, node_bytes: usize) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: type_url.into(),
        node: (node_bytes > 0).then(|| Node {
            id: "x".repeat(node_bytes),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn messages_split_across_frames_or_sharing_one_are_all_decoded() {
    let (a, b, c) = (request("a", 0), request("b", 10), request("c", 0));
    let mut bytes = framed(&a);
    bytes.extend(framed(&b));
    let third = framed(&c);
    // a and b in one frame; c cut into three frames, one of them inside its header.
    let mut r = requests(vec![
        bytes,
        third[..2].to_vec(),
        third[2..7].to_vec(),
        third[7..].to_vec(),
    ]);
    assert_eq!(r.message().await.unwrap(), Some(a));
    assert_eq!(r.message().await.unwrap(), Some(b));
    assert_eq!(r.message().await.unwrap(), Some(c));
    assert_eq!(r.message().await.unwrap(), None);
}

#[tokio::test]
async fn a_large_request_leaves_no_large_buffer_behind() {
    // Envoy's first request carries its node (some 60 KB); the ACKs after it are small.
    let big = framed(&request("a", 64 * 1024));
    let mut r = requests(vec![
        big[..30_000].to_vec(),
        big[30_000..].to_vec(),
        framed(&request("b", 0)),
    ]);
    assert_eq!(r.message().await.unwrap().unwrap().type_url, "a");
    assert_eq!(r.buf.capacity(), 0, "the buffer that held the node is kept");
    assert_eq!(r.message().await.unwrap().unwrap().type_url, "b");
    assert!(r.buf.capacity() <= BUFFER_BYTES);
}

/// The refusal a request got (panics on anything else).
async fn refusal(mut r: Requests<DeltaDiscoveryRequest>) -> Status {
    match r.message().await {
        Err(RequestError::Refused(status)) => status,
        other => panic!("not refused: {other:?}"),
    }
}

/// Serves no proxy: these streams end before one would be looked up.
struct NoProxies;

impl proxycfg::SnapshotSource for NoProxies {
    fn watch(
        &self,
        _: &proxycfg::ProxyRequest<'_>,
    ) -> Result<(proxycfg::Watcher, proxycfg::SourceLease), proxycfg::SourceError> {
        Err(proxycfg::SourceError::NotFound("none".to_owned()))
    }
}

#[tokio::test]
async fn a_refused_request_ends_the_stream_with_its_reason_not_ok() {
    use crate::delta::DeltaState;
    use tokio_stream::StreamExt as _;
    let server = XdsServer::new(std::sync::Arc::new(NoProxies));
    let mut garbage = vec![0, 0, 0, 0, 3];
    garbage.extend_from_slice(&[0xff, 0xff, 0xff]);
    let request = Request::new(requests(vec![garbage]));
    let mut responses = server.open::<DeltaState>(request).unwrap().into_inner();
    let ended = responses
        .next()
        .await
        .expect("the stream says why it ends")
        .unwrap_err();
    assert_eq!(ended.code(), tonic::Code::InvalidArgument);
    assert!(ended.message().starts_with("decoding a request"), "{}", ended.message());
    assert!(responses.next().await.is_none());
    // A client that hangs up before its first request: the stream just ends.
    let mut responses = server
        .open::<DeltaState>(Request::new(requests(vec![])))
        .unwrap()
        .into_inner();
    assert!(responses.next().await.is_none());
}

#[tokio::test]
async fn bad_requests_end_the_stream_with_a_status_that_says_why() {
    let mut compressed = framed(&request("a", 0));
    compressed[0] = 1;
    let e = refusal(requests(vec![compressed])).await;
    assert_eq!(e.code(), tonic::Code::Unimplemented);

    let mut huge = vec![0];
    huge.extend_from_slice(&(MAX_REQUEST_BYTES as u32 + 1).to_be_bytes());
    let e = refusal(requests(vec![huge])).await;
    assert_eq!(e.code(), tonic::Code::ResourceExhausted);
    assert!(e.message().contains("over the limit"), "{}", e.message());

    let whole = framed(&request("a", 10));
    let e = refusal(requests(vec![whole[..whole.len() - 1].to_vec()])).await;
    assert_eq!(e.code(), tonic::Code::InvalidArgument);

    let mut garbage = vec![0, 0, 0, 0, 3];
    garbage.extend_from_slice(&[0xff, 0xff, 0xff]);
    let e = refusal(requests(vec![garbage])).await;
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().starts_with("decoding a request"), "{}", e.message());
}
