//! The store the flags ask for, and the ACL state a server with ACLs needs in it.

use crate::ServerArgs;
use crate::error::{ServerError, chain};
use catalog::{Store, StoreConfig};
use std::net::SocketAddr;
use tracing::info;

/// The store: durable in `-data-dir`, in memory with `-dev`, or in etcd with `-store etcd`
/// (registered there under `http_addr`).
#[cfg_attr(not(feature = "etcd"), allow(unused_variables, unused_mut))]
pub(crate) async fn open(
    args: &ServerArgs,
    http_addr: SocketAddr,
    grpc_addr: SocketAddr,
    grpc_tls_addr: Option<SocketAddr>,
) -> Result<Store, ServerError> {
    let flags = |m: &str| ServerError::Flags(m.to_owned());
    let mut config = StoreConfig {
        datacenter: args.datacenter.clone(),
        data_dir: args.data_dir.clone(),
        primary_datacenter: args.primary_datacenter.clone(),
        audit_retention: args.audit_retention,
        ca_cluster_id: args.ca_cluster_id.clone(),
        ..StoreConfig::default()
    };
    #[cfg(feature = "etcd")]
    if args.store == "etcd" {
        if args.etcd_endpoints.is_empty() {
            return Err(flags("-store etcd needs -etcd-endpoints URL[,URL...]"));
        }
        if args.data_dir.is_some() || args.dev {
            return Err(flags(
                "-store etcd keeps the catalog in etcd: it excludes -data-dir and -dev",
            ));
        }
        let mut etcd = catalog_etcd::EtcdConfig::new(args.etcd_endpoints.clone());
        etcd.prefix = args.etcd_prefix.clone();
        etcd.server_name = args.node.clone();
        etcd.advertise = http_addr.to_string();
        etcd.xds_address = grpc_addr.to_string();
        etcd.grpc_tls_address = grpc_tls_addr.map(|a| a.to_string()).unwrap_or_default();
        etcd.lease_ttl = args.etcd_lease_ttl;
        etcd.request_timeout = args.etcd_request_timeout;
        etcd.max_txn_ops = args.etcd_max_txn_ops as usize;
        config.backend = Some(std::sync::Arc::new(etcd));
        return Store::open(config).await.map_err(|e| {
            ServerError::Store(format!(
                "cannot use etcd at {}: {}",
                args.etcd_endpoints.join(","),
                chain(&e)
            ))
        });
    }
    if !args.etcd_endpoints.is_empty() {
        return Err(flags("-etcd-endpoints is for -store etcd"));
    }
    if args.data_dir.is_none() && !args.dev {
        return Err(flags("one of -data-dir, -dev or -store etcd is required"));
    }
    if args.data_dir.is_some() && args.dev {
        return Err(flags(
            "-data-dir and -dev exclude each other: -dev keeps state in memory",
        ));
    }
    Store::open(config).await.map_err(|e| {
        let what = match &args.data_dir {
            Some(dir) => format!("cannot use data dir {}", dir.display()),
            None => "cannot open the in-memory store".to_owned(),
        };
        ServerError::Store(format!("{what}: {}", chain(&e)))
    })
}

/// Creates what ACLs need (the built-in policy, the anonymous token) and the initial
/// management token if a file names one.
pub(crate) async fn init_acls(store: &Store, initial_management: Option<&std::path::Path>) -> Result<(), ServerError> {
    store
        .write(catalog::Op::AclInit)
        .await
        .map_err(|e| ServerError::Store(format!("initialising ACLs: {}", chain(&e))))?;
    let Some(path) = initial_management else {
        return Ok(());
    };
    let secret = std::fs::read_to_string(path)
        .map_err(|e| {
            ServerError::Flags(format!(
                "-acl-initial-management-token-file: cannot read {}: {e}",
                path.display()
            ))
        })?
        .trim()
        .to_owned();
    if store.read().acl_token_by_secret(&secret).is_some() {
        return Ok(());
    }
    let accessor_id =
        catalog::ca::new_uuid().map_err(|e| ServerError::Store(format!("generating an accessor id: {}", chain(&e))))?;
    let token = structs::acl::AclToken {
        accessor_id,
        secret_id: secret,
        description: "Initial Management Token".into(),
        policies: vec![structs::acl::Link {
            id: structs::acl::GLOBAL_MANAGEMENT_ID.into(),
            name: String::new(),
        }],
        ..Default::default()
    };
    store
        .write(catalog::Op::AclTokenSet {
            token: Box::new(token),
            create: true,
            ttl: None,
        })
        .await
        .map_err(|e| ServerError::Store(format!("-acl-initial-management-token-file: {e}")))?;
    info!("initial management token created");
    Ok(())
}
