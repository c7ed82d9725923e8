//! Escape hatches: Envoy JSON in a proxy's `Config` standing in for what meshd would build
//! (Consul's keys). `envoy_public_listener_json` replaces the public listener, still with the
//! mesh's mTLS and the intentions' (L4) RBAC put in front of each filter chain, as Consul
//! does, so an escape hatch cannot open the service to the world; `envoy_local_cluster_json`
//! replaces `local_app`; an upstream's `envoy_listener_json` replaces its listener;
//! `envoy_listener_tracing_json` is the tracing of every HTTP connection manager. Each was
//! checked against Envoy's types when written; one that fails here (a `proxy-defaults` value
//! merged in) is a build problem in the proxy's status, and meshd's own resource is used.

use super::{BuildError, LISTENER, Resources};
use envoy_types::pb::envoy::config::listener::v3::{Listener, filter};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager,
};
use envoy_types::util::pack_any;
use prost::{Message, Name};
use proxycfg::ConfigSnapshot;
use structs::protocol::OpaqueConfig;

/// The string at `key`: the proxy's own `Config`, else its resolved central config.
pub(crate) fn value<'a>(snap: &'a ConfigSnapshot, key: &str) -> Option<&'a str> {
    let resolved = snap
        .connect_proxy()
        .and_then(|cp| cp.resolved_config.as_deref())
        .map(|r| &r.proxy_config);
    let from = |c: Option<&'a OpaqueConfig>| c?.get(key)?.as_str().filter(|s| !s.trim().is_empty());
    from(Some(&snap.service.proxy.config)).or_else(|| from(resolved))
}

/// Decodes the escape hatch `json` of `key` as `T` (Envoy type `ty`).
pub(crate) fn decode<T: Message + Default>(key: &str, ty: &str, json: &str) -> Result<T, String> {
    let any = envoy_json::decode_cached(ty, json).map_err(|e| format!("Config.{key} {e}"))?;
    T::decode(any.value.as_slice()).map_err(|e| format!("Config.{key}: {e}"))
}

/// The proxy's `envoy_public_listener_json`, decoded, if set.
pub(crate) fn public_listener(snap: &ConfigSnapshot) -> Option<Result<Listener, String>> {
    const KEY: &str = "envoy_public_listener_json";
    value(snap, KEY).map(|json| decode(KEY, envoy_json::LISTENER, json))
}

/// Sets the tracing of every HTTP connection manager on `out`'s listeners from the proxy's
/// `envoy_listener_tracing_json`.
pub(crate) fn apply_tracing(snap: &ConfigSnapshot, out: &mut Resources) -> Result<(), BuildError> {
    const KEY: &str = "envoy_listener_tracing_json";
    if snap.service.connect.native {
        return Ok(());
    }
    let Some(json) = value(snap, KEY) else { return Ok(()) };
    let tracing: http_connection_manager::Tracing = match decode(KEY, envoy_json::HCM_TRACING, json) {
        Ok(t) => t,
        Err(e) => {
            out.problems.insert(KEY.into(), e);
            return Ok(());
        }
    };
    let Some(listeners) = out.by_type.get_mut(LISTENER) else {
        return Ok(());
    };
    let invalid = |what: &str, e: prost::DecodeError| BuildError::Invalid(format!("{KEY}: decoding {what}: {e}"));
    for (name, any) in listeners.iter_mut() {
        let mut listener = Listener::decode(any.value.as_slice()).map_err(|e| invalid(name, e))?;
        let mut changed = false;
        for chain in &mut listener.filter_chains {
            for f in &mut chain.filters {
                if let Some(filter::ConfigType::TypedConfig(typed)) = &mut f.config_type
                    && typed.type_url == HttpConnectionManager::type_url()
                {
                    let mut hcm =
                        HttpConnectionManager::decode(typed.value.as_slice()).map_err(|e| invalid(name, e))?;
                    hcm.tracing = Some(tracing.clone());
                    *typed = pack_any(hcm);
                    changed = true;
                }
            }
        }
        if changed {
            *any = pack_any(listener);
        }
    }
    Ok(())
}
