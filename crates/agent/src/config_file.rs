//! `-config-file` JSON: the agent's settings (the command line's names, any key casing, plus
//! Consul's `node_name`, `advertise_addr` and `node_meta`) and the `services`/`service` and
//! `checks`/`check` to register. Several files merge in order: later settings win, services
//! and checks add up. An unknown key is an error naming it, never ignored, at any depth of a
//! service or check definition too (the HTTP API ignores unknown keys, as Consul's does).

use serde::Deserialize;
use std::path::{Path, PathBuf};
use structs::agent::{CheckType, ServiceDefinition};

/// One config file's content (or several merged).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FileConfig {
    /// Node name.
    #[serde(rename = "Node", alias = "node_name")]
    pub node: Option<String>,
    /// Data directory.
    #[serde(rename = "DataDir")]
    pub data_dir: Option<PathBuf>,
    /// Keep everything in memory.
    #[serde(rename = "Dev")]
    pub dev: Option<bool>,
    /// Servers' HTTP addresses.
    #[serde(rename = "RetryJoin")]
    pub retry_join: Vec<String>,
    /// The agent's HTTP address.
    #[serde(rename = "HttpAddr")]
    pub http_addr: Option<String>,
    /// The agent's gRPC address.
    #[serde(rename = "GrpcAddr")]
    pub grpc_addr: Option<String>,
    /// Datacenter.
    #[serde(rename = "Datacenter")]
    pub datacenter: Option<String>,
    /// Address of the node in the catalog.
    #[serde(rename = "Advertise", alias = "advertise_addr")]
    pub advertise: Option<String>,
    /// Node id (a UUID).
    #[serde(rename = "NodeID", alias = "node_id")]
    pub node_id: Option<String>,
    /// Node metadata (merged over earlier files').
    #[serde(rename = "NodeMeta")]
    pub node_meta: std::collections::BTreeMap<String, String>,
    /// Log level.
    #[serde(rename = "LogLevel")]
    pub log_level: Option<String>,
    /// JSON logs.
    #[serde(rename = "LogJson")]
    pub log_json: Option<bool>,
    /// Deregister the node on SIGINT/SIGTERM.
    #[serde(rename = "LeaveOnTerminate")]
    pub leave_on_terminate: Option<bool>,
    /// Run `Connect.SidecarService` sidecars as managed proxies.
    #[serde(rename = "ManagedSidecars")]
    pub managed_sidecars: Option<bool>,
    /// Run managed proxies even as root.
    #[serde(rename = "AllowManagedRoot")]
    pub allow_managed_root: Option<bool>,
    /// Accept `Connect.Proxy.Command` from the HTTP API (config files may always set it).
    #[serde(rename = "AllowManagedAPIRegistration", alias = "AllowManagedApiRegistration")]
    pub allow_managed_api_registration: Option<bool>,
    /// The Envoy binary managed proxies run.
    #[serde(rename = "EnvoyBinary")]
    pub envoy_binary: Option<PathBuf>,
    /// CIDR blocks checks registered through the API may probe besides their service's own
    /// address and port (each entry may list several, comma-separated; files add up).
    #[serde(rename = "CheckAllowedTargets")]
    pub check_allowed_targets: Vec<String>,
    /// Consul's `ports` block: the sidecar range.
    #[serde(rename = "Ports")]
    pub ports: FilePorts,
    /// Services to register.
    #[serde(rename = "Services")]
    pub services: Vec<ServiceDefinition>,
    /// One service to register.
    #[serde(rename = "Service")]
    pub service: Option<ServiceDefinition>,
    /// Checks to register.
    #[serde(rename = "Checks")]
    pub checks: Vec<CheckType>,
    /// One check to register.
    #[serde(rename = "Check")]
    pub check: Option<CheckType>,
}

/// A config file's `ports` block (Consul's keys; the sidecar and expose ranges are used).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FilePorts {
    /// Lowest port a sidecar registered without one gets.
    #[serde(rename = "SidecarMinPort")]
    pub sidecar_min_port: Option<u16>,
    /// Highest such port.
    #[serde(rename = "SidecarMaxPort")]
    pub sidecar_max_port: Option<u16>,
    /// Lowest port an exposed check listener gets.
    #[serde(rename = "ExposeMinPort")]
    pub expose_min_port: Option<u16>,
    /// Highest such port.
    #[serde(rename = "ExposeMaxPort")]
    pub expose_max_port: Option<u16>,
}

/// A config file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// It cannot be read.
    #[error("cannot read config file {path}: {error}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// It is not a valid config.
    #[error("config file {path}: {error}")]
    Decode {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the key's path.
        error: structs::DecodeError,
    },
}

impl FileConfig {
    /// Reads and merges `paths` in order.
    pub fn load(paths: &[PathBuf]) -> Result<FileConfig, ConfigError> {
        let mut out = FileConfig::default();
        for path in paths {
            out.merge(Self::read(path)?);
        }
        Ok(out)
    }

    /// Reads and merges `paths` in order, refusing any key but `services`/`service` and
    /// `checks`/`check` (a server's config files: its settings are flags).
    pub fn load_definitions(paths: &[PathBuf]) -> Result<FileConfig, ConfigError> {
        let mut out = FileConfig::default();
        for path in paths {
            let file = Self::read(path)?;
            if let Some(key) = file.first_setting() {
                return Err(ConfigError::Decode {
                    path: path.clone(),
                    error: structs::DecodeError {
                        path: key.to_owned(),
                        message: "an agent setting: a server's config files hold services and checks only \
                                  (its settings are flags)"
                            .into(),
                    },
                });
            }
            out.merge(file);
        }
        Ok(out)
    }

    /// The name of the first setting given (services and checks aside), if any.
    fn first_setting(&self) -> Option<&'static str> {
        // Every field named: a new setting cannot be forgotten here.
        let FileConfig {
            node,
            data_dir,
            dev,
            retry_join,
            http_addr,
            grpc_addr,
            datacenter,
            advertise,
            node_id,
            node_meta,
            log_level,
            log_json,
            leave_on_terminate,
            managed_sidecars,
            allow_managed_root,
            allow_managed_api_registration,
            envoy_binary,
            check_allowed_targets,
            ports,
            services: _,
            service: _,
            checks: _,
            check: _,
        } = self;
        let given = [
            ("Node", node.is_some()),
            ("DataDir", data_dir.is_some()),
            ("Dev", dev.is_some()),
            ("RetryJoin", !retry_join.is_empty()),
            ("HttpAddr", http_addr.is_some()),
            ("GrpcAddr", grpc_addr.is_some()),
            ("Datacenter", datacenter.is_some()),
            ("Advertise", advertise.is_some()),
            ("NodeID", node_id.is_some()),
            ("NodeMeta", !node_meta.is_empty()),
            ("LogLevel", log_level.is_some()),
            ("LogJson", log_json.is_some()),
            ("LeaveOnTerminate", leave_on_terminate.is_some()),
            ("ManagedSidecars", managed_sidecars.is_some()),
            ("AllowManagedRoot", allow_managed_root.is_some()),
            ("AllowManagedApiRegistration", allow_managed_api_registration.is_some()),
            ("EnvoyBinary", envoy_binary.is_some()),
            ("CheckAllowedTargets", !check_allowed_targets.is_empty()),
            (
                "Ports",
                ports.sidecar_min_port.is_some()
                    || ports.sidecar_max_port.is_some()
                    || ports.expose_min_port.is_some()
                    || ports.expose_max_port.is_some(),
            ),
        ];
        given.into_iter().find(|(_, set)| *set).map(|(name, _)| name)
    }

    fn read(path: &Path) -> Result<FileConfig, ConfigError> {
        let bytes = std::fs::read(path).map_err(|error| ConfigError::Read {
            path: path.to_owned(),
            error,
        })?;
        let decode_error = |error| ConfigError::Decode {
            path: path.to_owned(),
            error,
        };
        let value: serde_json::Value = structs::json::from_slice(&bytes).map_err(decode_error)?;
        check_definition_keys(&value).map_err(decode_error)?;
        structs::json::from_value(value).map_err(decode_error)
    }

    fn merge(&mut self, other: FileConfig) {
        macro_rules! later_wins {
            ($($f:ident)*) => {$( if other.$f.is_some() { self.$f = other.$f; } )*};
        }
        later_wins!(node node_id data_dir dev http_addr grpc_addr datacenter advertise log_level log_json leave_on_terminate
            managed_sidecars allow_managed_root allow_managed_api_registration envoy_binary);
        let ports = other.ports;
        self.ports.sidecar_min_port = ports.sidecar_min_port.or(self.ports.sidecar_min_port);
        self.ports.sidecar_max_port = ports.sidecar_max_port.or(self.ports.sidecar_max_port);
        self.retry_join.extend(other.retry_join);
        self.check_allowed_targets.extend(other.check_allowed_targets);
        self.node_meta.extend(other.node_meta);
        self.services.extend(other.service);
        self.services.extend(other.services);
        self.checks.extend(other.check);
        self.checks.extend(other.checks);
    }
}

/// Refuses unknown keys inside `services`/`service` and `checks`/`check` (any key casing),
/// naming the key and where it is.
fn check_definition_keys(file: &serde_json::Value) -> Result<(), structs::DecodeError> {
    use structs::json::from_value_strict;
    let Some(top) = file.as_object() else {
        return Ok(());
    };
    for (key, value) in top {
        let folded: String = key
            .chars()
            .filter(|c| !matches!(c, '_' | '-'))
            .map(|c| c.to_ascii_lowercase())
            .collect();
        let checked = match folded.as_str() {
            "services" => from_value_strict::<Vec<ServiceDefinition>>(value.clone()).map(drop),
            "service" => from_value_strict::<Option<ServiceDefinition>>(value.clone()).map(drop),
            "checks" => from_value_strict::<Vec<CheckType>>(value.clone()).map(drop),
            "check" => from_value_strict::<Option<CheckType>>(value.clone()).map(drop),
            _ => Ok(()),
        };
        checked.map_err(|e| structs::DecodeError {
            path: match e.path.as_str() {
                "" | "." => key.clone(),
                p if p.starts_with('[') => format!("{key}{p}"),
                p => format!("{key}.{p}"),
            },
            message: e.message,
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_merge_in_order_and_unknown_keys_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.json");
        let b = dir.path().join("b.json");
        std::fs::write(
            &a,
            r#"{"node_name": "n1", "retry_join": ["s1:8500"], "service": {"name": "web", "port": 80},
                "check_allowed_targets": ["127.0.0.1/32"],
                "checks": [{"id": "disk", "name": "disk", "ttl": "30s"}]}"#,
        )
        .unwrap();
        std::fs::write(
            &b,
            r#"{"Node": "n2", "RetryJoin": ["s2:8500"], "services": [{"Name": "api"}], "CheckAllowedTargets": ["10.0.0.0/8,::1"]}"#,
        )
        .unwrap();
        let c = FileConfig::load(&[a.clone(), b]).unwrap();
        assert_eq!(c.node.as_deref(), Some("n2"));
        assert_eq!(c.retry_join, ["s1:8500", "s2:8500"]);
        assert_eq!(c.check_allowed_targets, ["127.0.0.1/32", "10.0.0.0/8,::1"]);
        let names: Vec<&str> = c.services.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["web", "api"]);
        assert_eq!(c.checks.len(), 1);
        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, r#"{"nodename": "x", "bogus": 1}"#).unwrap();
        let err = FileConfig::load(std::slice::from_ref(&bad)).unwrap_err().to_string();
        assert!(err.contains("bogus") && err.contains("unknown field"), "{err}");
        // Inside service and check definitions too, at any depth, naming where.
        for (body, at, key) in [
            (
                r#"{"services": [{"name": "a"}, {"name": "b", "prot": 1}]}"#,
                "services[1]",
                "prot",
            ),
            (
                r#"{"service": {"name": "a", "check": {"ttl": "1s", "intervall": "2s"}}}"#,
                "service.Check",
                "intervall",
            ),
            (
                r#"{"service": {"name": "a", "connect": {"sidecar_service": {"proxy": {"upstreams": [{"destination_name": "x", "local_bind_port": 1, "bogus": 2}]}}}}}"#,
                "service.Connect.SidecarService.Proxy.Upstreams[0]",
                "bogus",
            ),
            (
                r#"{"checks": [{"name": "c", "ttl": "1s", "sevice_id": "a"}]}"#,
                "checks[0]",
                "sevice_id",
            ),
            (r#"{"Check": {"name": "c", "ttl": "1s", "x": 1}}"#, "Check", "x"),
        ] {
            std::fs::write(&bad, body).unwrap();
            let err = FileConfig::load(std::slice::from_ref(&bad)).unwrap_err().to_string();
            assert!(err.contains(&format!("{at}: unknown key \"{key}\"")), "{body}: {err}");
        }
        // Keys of user maps (Meta, Proxy.Config) stay free.
        std::fs::write(
            &bad,
            r#"{"service": {"name": "a", "meta": {"any_key": "v"}, "connect": {"sidecar_service": {"proxy": {"config": {"k": 1}}}}}}"#,
        )
        .unwrap();
        FileConfig::load(std::slice::from_ref(&bad)).unwrap();
        // Consul's `ports` block, key by key: the later file wins where it says something.
        let p1 = dir.path().join("p1.json");
        let p2 = dir.path().join("p2.json");
        std::fs::write(
            &p1,
            r#"{"ports": {"sidecar_min_port": 22000, "sidecar_max_port": 22099}}"#,
        )
        .unwrap();
        std::fs::write(&p2, r#"{"Ports": {"SidecarMaxPort": 22009}}"#).unwrap();
        let c = FileConfig::load(&[p1, p2]).unwrap();
        assert_eq!(
            (c.ports.sidecar_min_port, c.ports.sidecar_max_port),
            (Some(22000), Some(22009))
        );
        let other_port = dir.path().join("p3.json");
        std::fs::write(&other_port, r#"{"ports": {"dns": 8600}}"#).unwrap();
        let err = FileConfig::load(&[other_port]).unwrap_err().to_string();
        assert!(err.contains("dns") && err.contains("unknown field"), "{err}");
        let missing = FileConfig::load(&[dir.path().join("nope.json")])
            .unwrap_err()
            .to_string();
        assert!(missing.starts_with("cannot read config file"), "{missing}");
    }
}
