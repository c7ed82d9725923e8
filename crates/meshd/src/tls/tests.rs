//! TLS settings and the TLS listener (the `node` library's) with the certificates of the
//! `meshd tls` commands, against real handshakes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::certs::{ca_files, create_ca, create_cert};
use crate::cli::{TlsCaCreateArgs, TlsCertCreateArgs};
use node::cli::TlsArgs;
use node::conn_limit::ClientCounts;
use node::tls::config::provider;
use node::tls::listener::{PLAINTEXT_BODY, plaintext_refusal};
use node::tls::{TlsIncoming, TlsSettings, TlsSetupError};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// A CA, a server and a client certificate in `dir`: (ca, server cert, server key, client
/// cert, client key).
struct Files {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
}

fn make_certs(dir: &Path) -> Files {
    create_ca(&TlsCaCreateArgs {
        dir: dir.to_owned(),
        domain: "meshd".into(),
        days: 30,
    })
    .unwrap();
    let make = |server: bool| {
        let written = create_cert(&TlsCertCreateArgs {
            server,
            client: !server,
            dc: "dc1".into(),
            domain: "meshd".into(),
            ca: None,
            key: None,
            // The defaults repeated: each name is written once.
            additional_dnsname: vec!["extra.example".into(), "localhost".into()],
            additional_ipaddress: vec!["10.1.2.3".parse().unwrap(), "127.0.0.1".parse().unwrap()],
            days: 30,
            dir: dir.to_owned(),
        })
        .unwrap();
        (written[0].clone(), written[1].clone())
    };
    let (cert, key) = make(true);
    let (client_cert, client_key) = make(false);
    Files {
        ca: ca_files(dir, "meshd").0,
        cert,
        key,
        client_cert,
        client_key,
    }
}

fn args(files: &Files) -> TlsArgs {
    TlsArgs {
        https_addr: Some("127.0.0.1:0".parse().unwrap()),
        grpc_tls_addr: None,
        cert_file: Some(files.cert.clone()),
        key_file: Some(files.key.clone()),
        ca_file: Some(files.ca.clone()),
        verify_incoming: false,
    }
}

#[test]
fn tls_commands_write_named_files_with_private_keys() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let files = make_certs(dir.path());
    assert!(
        files.cert.ends_with("dc1-server-meshd-0.pem"),
        "{}",
        files.cert.display()
    );
    assert!(files.key.ends_with("dc1-server-meshd-0-key.pem"));
    assert!(files.client_cert.ends_with("dc1-client-meshd-0.pem"));
    for key in [&files.key, &files.client_key, &ca_files(dir.path(), "meshd").1] {
        let mode = std::fs::metadata(key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", key.display());
    }
    let pem = std::fs::read(&files.cert).unwrap();
    let der = CertificateDer::from_pem_slice(&pem).unwrap();
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    let sans = cert.subject_alternative_name().unwrap().unwrap().value;
    let names: Vec<String> = sans.general_names.iter().map(ToString::to_string).collect();
    assert_eq!(
        names,
        [
            "DNSName(server.dc1.meshd)",
            "DNSName(localhost)",
            "IPAddress(7f:00:00:01)",
            "DNSName(extra.example)",
            "IPAddress(0a:01:02:03)"
        ]
    );
    // A second CA in the same place is refused; a second certificate takes the next index.
    let again = create_ca(&TlsCaCreateArgs {
        dir: dir.path().to_owned(),
        domain: "meshd".into(),
        days: 30,
    });
    assert!(again.unwrap_err().to_string().contains("already exists"));
}

#[test]
fn bad_tls_settings_are_refused_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let files = make_certs(dir.path());
    let good = args(&files);
    let loaded = TlsSettings::load(&good).unwrap();
    assert!(loaded.server.is_some() && loaded.ca_pem.is_some());
    let err = |change: &dyn Fn(&mut TlsArgs)| {
        let mut a = good.clone();
        change(&mut a);
        TlsSettings::load(&a).unwrap_err()
    };

    let e = err(&|a| a.key_file = Some(dir.path().join("missing.pem")));
    assert!(
        matches!(
            e,
            TlsSetupError::Read {
                flag: "-tls-key-file",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().starts_with("-tls-key-file "), "{e}");
    assert!(e.to_string().contains("missing.pem: cannot read"), "{e}");
    let e = err(&|a| {
        a.cert_file = None;
        a.key_file = None;
    });
    assert_eq!(e.to_string(), "-https-addr needs -tls-cert-file and -tls-key-file");
    let e = err(&|a| {
        a.https_addr = None;
        a.grpc_tls_addr = Some("127.0.0.1:0".parse().unwrap());
        a.cert_file = None;
        a.key_file = None;
    });
    assert_eq!(e.to_string(), "-grpc-tls-addr needs -tls-cert-file and -tls-key-file");
    let e = err(&|a| a.key_file = None);
    assert_eq!(e.to_string(), "-tls-cert-file needs -tls-key-file");
    let e = err(&|a| {
        a.ca_file = None;
        a.verify_incoming = true;
    });
    assert!(matches!(e, TlsSetupError::VerifyWithoutCa));
    // The client's key is not the server certificate's.
    let e = err(&|a| a.key_file = Some(files.client_key.clone()));
    assert!(matches!(e, TlsSetupError::KeyMismatch { .. }), "{e}");
    // Files swapped: no certificate, no key; never the key's content in the message.
    let e = err(&|a| a.cert_file = Some(files.key.clone()));
    assert!(e.to_string().contains("no PEM certificate"), "{e}");
    let e = err(&|a| a.key_file = Some(files.cert.clone()));
    assert!(e.to_string().starts_with("-tls-key-file "), "{e}");
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(
        &garbage,
        "-----BEGIN PRIVATE KEY-----\nnot base64 at all!\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    let e = err(&|a| a.key_file = Some(garbage.clone()));
    assert!(!e.to_string().contains("not base64"), "{e}");
    let e = err(&|a| a.ca_file = Some(garbage.clone()));
    assert!(e.to_string().starts_with("-tls-ca-file "), "{e}");
    // Every message is one line.
    for e in [e, err(&|a| a.key_file = Some(dir.path().join("missing.pem")))] {
        assert!(!e.to_string().contains('\n'), "{e}");
    }
    // No TLS listener: nothing to serve, the CA alone is fine (an agent's -retry-join).
    let ca_only = TlsSettings::load(&TlsArgs {
        ca_file: Some(files.ca.clone()),
        ..TlsArgs::default()
    })
    .unwrap();
    assert!(ca_only.server.is_none() && ca_only.ca_pem.is_some());
}

/// A listener serving `files`' server certificate; a task that keeps the first accepted
/// connections' streams open.
async fn listen(files: &Files, verify: bool) -> (TlsIncoming, CancellationToken) {
    let mut a = args(files);
    a.verify_incoming = verify;
    let settings = TlsSettings::load(&a).unwrap();
    let server = settings.server.unwrap();
    let stop = CancellationToken::new();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let incoming = TlsIncoming::start(listener, server.http, ClientCounts::new(0), stop.clone(), "test").unwrap();
    (incoming, stop)
}

fn client_config(files: &Files, with_cert: bool) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(&files.ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = if with_cert {
        let chain = CertificateDer::pem_file_iter(&files.client_cert)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(&files.client_key).unwrap();
        builder.with_client_auth_cert(chain, key).unwrap()
    } else {
        builder.with_no_client_auth()
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

/// A TLS round trip: the client writes `ping`, reads what the server side echoes.
async fn round_trip(incoming: &mut TlsIncoming, config: Arc<rustls::ClientConfig>) -> std::io::Result<()> {
    round_trip_as(incoming, config, "localhost").await
}

/// As [`round_trip`], asking for the server `name`.
async fn round_trip_as(
    incoming: &mut TlsIncoming,
    config: Arc<rustls::ClientConfig>,
    name: &'static str,
) -> std::io::Result<()> {
    let tcp = TcpStream::connect(incoming.local_addr()).await?;
    let connector = tokio_rustls::TlsConnector::from(config);
    let client = async {
        let mut tls = connector.connect(ServerName::try_from(name).unwrap(), tcp).await?;
        tls.write_all(b"ping").await?;
        let mut answer = [0u8; 4];
        tls.read_exact(&mut answer).await?;
        assert_eq!(&answer, b"pong");
        Ok::<_, std::io::Error>(())
    };
    let server = async {
        let (mut stream, _) = incoming.next().await.unwrap();
        let mut got = [0u8; 4];
        stream.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
        stream.write_all(b"pong").await.unwrap();
        stream.flush().await.unwrap();
        // Keep it open until the client read the answer.
        std::future::pending::<()>().await;
    };
    tokio::select! {
        done = client => done,
        () = server => unreachable!(),
    }
}

#[tokio::test]
async fn plaintext_http_on_the_tls_port_gets_a_400_and_is_never_served() {
    let dir = tempfile::tempdir().unwrap();
    let files = make_certs(dir.path());
    let (mut incoming, stop) = listen(&files, false).await;

    let mut plain = TcpStream::connect(incoming.local_addr()).await.unwrap();
    plain
        .write_all(b"GET /v1/status/leader HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(10), plain.read_to_string(&mut answer))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer, plaintext_refusal());
    assert!(answer.starts_with("HTTP/1.0 400 Bad Request\r\n"), "{answer:?}");
    assert!(answer.ends_with(PLAINTEXT_BODY));

    // The refused connection never came out of the listener: the next one is a TLS client.
    round_trip(&mut incoming, client_config(&files, false)).await.unwrap();
    stop.cancel();
}

#[tokio::test]
async fn verify_incoming_requires_a_client_certificate_from_the_ca() {
    let dir = tempfile::tempdir().unwrap();
    let files = make_certs(dir.path());
    let (mut incoming, stop) = listen(&files, true).await;
    round_trip(&mut incoming, client_config(&files, true)).await.unwrap();

    // Without a certificate the server ends the handshake (TLS 1.3: the client learns it
    // on its first read).
    let tcp = TcpStream::connect(incoming.local_addr()).await.unwrap();
    let connector = tokio_rustls::TlsConnector::from(client_config(&files, false));
    let refused = async {
        let mut tls = connector
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await?;
        tls.write_all(b"ping").await?;
        let mut answer = [0u8; 4];
        tls.read_exact(&mut answer).await
    };
    let result = tokio::time::timeout(Duration::from_secs(10), refused).await.unwrap();
    assert!(result.is_err(), "a client without a certificate was served");
    stop.cancel();
}

#[tokio::test]
async fn a_silent_client_does_not_hold_up_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let files = make_certs(dir.path());
    let (mut incoming, stop) = listen(&files, false).await;
    // Connected, never sends a byte: its handshake waits in its own task.
    let _silent = TcpStream::connect(incoming.local_addr()).await.unwrap();
    round_trip(&mut incoming, client_config(&files, false)).await.unwrap();
    stop.cancel();
}

#[tokio::test]
async fn the_per_client_limit_applies_before_the_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let files = make_certs(dir.path());
    let settings = TlsSettings::load(&args(&files)).unwrap();
    let stop = CancellationToken::new();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let counts = ClientCounts::new(1);
    let mut incoming = TlsIncoming::start(
        listener,
        settings.server.unwrap().http,
        counts.clone(),
        stop.clone(),
        "test",
    )
    .unwrap();
    let addr = incoming.local_addr();
    let connector = tokio_rustls::TlsConnector::from(client_config(&files, false));
    let name = || ServerName::try_from("localhost").unwrap();

    // The first connection is admitted and kept open.
    let first = connector.connect(name(), TcpStream::connect(addr).await.unwrap());
    let (first, accepted) = tokio::join!(first, incoming.next());
    let (_first, _accepted) = (first.unwrap(), accepted.unwrap());
    assert_eq!(counts.open_from("127.0.0.1".parse().unwrap()), 1);

    // The second is closed before any handshake.
    let second = connector.connect(name(), TcpStream::connect(addr).await.unwrap());
    let refused = tokio::time::timeout(Duration::from_secs(10), second).await.unwrap();
    assert!(refused.is_err(), "a connection past the limit was handshaken");
    assert_eq!(counts.open_from("127.0.0.1".parse().unwrap()), 1);
    stop.cancel();
}

/// A mode's own name (`extra.example` here; a server's peering name in meshd).
struct OwnName(Arc<rustls::ServerConfig>);

impl node::tls::ServerNames for OwnName {
    fn config_for(&self, name: &str) -> Option<Arc<rustls::ServerConfig>> {
        (name == "extra.example").then(|| Arc::clone(&self.0))
    }
}

#[tokio::test]
async fn a_modes_own_names_are_served_without_the_operators_certificate_and_nothing_else_is() {
    let dir = tempfile::tempdir().unwrap();
    let files = make_certs(dir.path());
    let own = TlsSettings::load(&args(&files)).unwrap().server.unwrap().http;
    // -grpc-tls-addr alone: refused for an agent, taken by a server (its peering name).
    let grpc_only = TlsArgs {
        grpc_tls_addr: Some("127.0.0.1:0".parse().unwrap()),
        ..TlsArgs::default()
    };
    assert!(matches!(
        TlsSettings::load(&grpc_only),
        Err(TlsSetupError::NoIdentity {
            listener: "-grpc-tls-addr"
        })
    ));
    assert!(TlsSettings::load_for(&grpc_only, true).unwrap().server.is_none());
    let https_too = TlsArgs {
        https_addr: Some("127.0.0.1:0".parse().unwrap()),
        ..grpc_only
    };
    assert!(
        TlsSettings::load_for(&https_too, true).is_err(),
        "HTTPS still needs the operator's"
    );

    let stop = CancellationToken::new();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let certs = node::tls::Certs {
        default: None,
        names: Some(Arc::new(OwnName(own))),
    };
    let mut incoming = TlsIncoming::start(listener, certs, ClientCounts::new(0), stop.clone(), "test").unwrap();
    round_trip_as(&mut incoming, client_config(&files, false), "extra.example")
        .await
        .unwrap();
    // Any other name: no certificate, no handshake.
    let other = tokio::time::timeout(
        Duration::from_secs(10),
        round_trip_as(&mut incoming, client_config(&files, false), "localhost"),
    )
    .await
    .unwrap();
    assert!(other.is_err(), "a name the mode does not serve was served");
    stop.cancel();
}

/// A connection made for a mode's own name comes out of the own half of the split (served
/// the mode's services alone), any other out of the other half (xDS).
#[tokio::test]
async fn connections_for_a_modes_names_are_split_from_the_others() {
    use tokio_stream::StreamExt;
    let dir = tempfile::tempdir().unwrap();
    let files = make_certs(dir.path());
    let config = TlsSettings::load(&args(&files)).unwrap().server.unwrap().http;
    let stop = CancellationToken::new();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let certs = node::tls::Certs {
        default: Some(Arc::clone(&config)),
        names: Some(Arc::new(OwnName(config))),
    };
    let incoming = TlsIncoming::start(listener, certs, ClientCounts::new(0), stop.clone(), "test").unwrap();
    let addr = incoming.local_addr();
    let (mut own, mut other) = incoming.split_grpc(|name| name == "extra.example");
    let dial = |name: &'static str| {
        let config = client_config(&files, false);
        async move {
            let tcp = TcpStream::connect(addr).await.unwrap();
            let mut tls = tokio_rustls::TlsConnector::from(config)
                .connect(ServerName::try_from(name).unwrap(), tcp)
                .await
                .unwrap();
            tls.write_all(name.as_bytes()).await.unwrap();
            tls
        }
    };
    let _peer = dial("extra.example").await;
    let mut got = tokio::time::timeout(Duration::from_secs(10), own.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let mut buf = [0u8; 13];
    got.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"extra.example");
    let _xds = dial("localhost").await;
    let mut got = tokio::time::timeout(Duration::from_secs(10), other.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let mut buf = [0u8; 9];
    got.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"localhost");
    stop.cancel();
}
