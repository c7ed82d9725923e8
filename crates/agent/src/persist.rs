//! Services and checks registered through the API survive a restart: one JSON file per
//! service (`<data-dir>/services/`) and per check (`<data-dir>/checks/`), each written
//! atomically (temporary file, fsync, rename, fsync of the directory). At start every file is
//! read back; a file that cannot be read or decoded is skipped with one log line, the rest
//! load.

use serde::{Deserialize, Serialize};
use std::io;
use std::path::{Path, PathBuf};
use structs::agent::CheckType;
use structs::{HealthCheck, NodeService};
use tracing::warn;

/// A persisted service.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PersistedService {
    /// The instance.
    #[serde(rename = "Service")]
    pub service: NodeService,
    /// The parent of a sidecar.
    #[serde(rename = "SidecarOf", default, skip_serializing_if = "Option::is_none")]
    pub sidecar_of: Option<String>,
    /// For a proxy the agent runs: how.
    #[serde(rename = "Managed", default, skip_serializing_if = "Option::is_none")]
    pub managed: Option<crate::local::Managed>,
    /// The token it was registered with (the file is 0600).
    #[serde(
        rename = "Token",
        default,
        with = "structs::token::opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub token: Option<structs::Token>,
}

/// A persisted check.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PersistedCheck {
    /// The check as registered.
    #[serde(rename = "Check")]
    pub check: HealthCheck,
    /// Its definition; absent for maintenance checks.
    #[serde(rename = "Definition", default, skip_serializing_if = "Option::is_none")]
    pub definition: Option<CheckType>,
}

/// The agent's directory of persisted registrations.
#[derive(Debug, Clone)]
pub struct Persistence {
    services: PathBuf,
    checks: PathBuf,
}

/// A file name for an id: letters, digits, `-`, `_` and `.` as they are, anything else as
/// `%XX`, so every id maps to one distinct, safe name.
fn file_name(id: &str) -> String {
    format!("{}.json", atomic_file::file_name_for(id))
}

/// A new random UUID (version 4), as text.
pub fn random_uuid() -> io::Result<String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| io::Error::other(format!("no random bytes: {e}")))?;
    Ok(uuid::Builder::from_random_bytes(bytes)
        .into_uuid()
        .hyphenated()
        .to_string())
}

/// The node id kept in `<data_dir>/node-id`, made (a random UUID, written `0600`) at the
/// first start. A file that does not hold a UUID is an error naming it, not replaced: the
/// catalog knows the node by it.
pub fn node_id(data_dir: &Path) -> io::Result<String> {
    atomic_file::kept_id(
        &data_dir.join("node-id"),
        |id| uuid::Uuid::parse_str(id).is_ok(),
        random_uuid,
    )
}

impl Persistence {
    /// Opens (creating) `<data_dir>/services` and `<data_dir>/checks`; the data dir is made
    /// private (`0700`, files `0600`: registrations can hold check headers and tokens), and
    /// one line says so when it was wider.
    pub fn open(data_dir: &Path) -> io::Result<Self> {
        atomic_file::private_dir(data_dir)?;
        let services = data_dir.join("services");
        let checks = data_dir.join("checks");
        atomic_file::private_dir(&services)?;
        atomic_file::private_dir(&checks)?;
        Ok(Self { services, checks })
    }

    /// Writes a service's file.
    pub fn save_service(&self, svc: &PersistedService) -> io::Result<()> {
        let bytes = serde_json::to_vec_pretty(svc).map_err(io::Error::other)?;
        atomic_file::write_atomic(&self.services.join(file_name(&svc.service.id)), &bytes, 0o600)
    }

    /// Writes a check's file.
    pub fn save_check(&self, check: &PersistedCheck) -> io::Result<()> {
        let bytes = serde_json::to_vec_pretty(check).map_err(io::Error::other)?;
        atomic_file::write_atomic(&self.checks.join(file_name(&check.check.check_id)), &bytes, 0o600)
    }

    /// Removes a service's file (absent is fine).
    pub fn remove_service(&self, id: &str) -> io::Result<()> {
        remove(&self.services.join(file_name(id)))
    }

    /// Removes a check's file (absent is fine).
    pub fn remove_check(&self, id: &str) -> io::Result<()> {
        remove(&self.checks.join(file_name(id)))
    }

    /// Every readable persisted service and check.
    pub fn load(&self) -> io::Result<(Vec<PersistedService>, Vec<PersistedCheck>)> {
        Ok((load_dir(&self.services, "service")?, load_dir(&self.checks, "check")?))
    }
}

fn remove(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => std::fs::File::open(path.parent().unwrap_or(Path::new(".")))?.sync_all(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

fn load_dir<T: serde::de::DeserializeOwned>(dir: &Path, what: &str) -> io::Result<Vec<T>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|x| x == "json")
                // Leftovers of an interrupted write start with a dot.
                && !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .collect();
    paths.sort();
    let mut out = Vec::with_capacity(paths.len());
    for path in paths {
        let decoded = std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|bytes| serde_json::from_slice(&bytes).map_err(|e| e.to_string()));
        match decoded {
            Ok(v) => out.push(v),
            Err(error) => warn!(path = %path.display(), %error, "skipping a persisted {what} that cannot be read"),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_id_is_made_once_kept_private_and_never_replaced() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let first = node_id(dir.path()).unwrap();
        assert!(uuid::Uuid::parse_str(&first).is_ok(), "{first}");
        let mode = std::fs::metadata(dir.path().join("node-id"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(node_id(dir.path()).unwrap(), first, "the same id at every start");
        std::fs::write(dir.path().join("node-id"), "not-a-uuid").unwrap();
        let e = node_id(dir.path()).unwrap_err();
        assert!(e.to_string().ends_with("node-id does not hold a valid id"), "{e}");
    }

    #[test]
    fn ids_map_to_distinct_safe_names() {
        assert_eq!(file_name("web-1"), "web-1.json");
        assert_eq!(file_name("service:web:1"), "service%3Aweb%3A1.json");
        assert_eq!(file_name("../x"), "%2E.%2Fx.json");
        assert_ne!(file_name("a:b"), file_name("a%3Ab"));
    }

    #[test]
    fn round_trip_and_a_corrupt_file_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let p = Persistence::open(dir.path()).unwrap();
        for id in ["a", "b"] {
            p.save_service(&PersistedService {
                service: NodeService {
                    id: id.into(),
                    service: "web".into(),
                    ..NodeService::default()
                },
                sidecar_of: None,
                managed: None,
                token: None,
            })
            .unwrap();
        }
        std::fs::write(dir.path().join("services/c.json"), b"{not json").unwrap();
        let (services, checks) = p.load().unwrap();
        assert_eq!(
            services.iter().map(|s| s.service.id.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert!(checks.is_empty());
        p.remove_service("a").unwrap();
        p.remove_service("a").unwrap();
        assert_eq!(p.load().unwrap().0.len(), 1);
    }

    #[test]
    fn tokens_keep_their_file_shape() {
        let service = |token: Option<&str>, managed: Option<crate::local::Managed>| PersistedService {
            service: NodeService {
                id: "web-sidecar-proxy".into(),
                ..NodeService::default()
            },
            sidecar_of: None,
            managed,
            token: token.and_then(structs::Token::new),
        };
        // None is left out, as "" was.
        let none = serde_json::to_value(service(None, Some(crate::local::Managed::default()))).unwrap();
        assert!(none.get("Token").is_none(), "{none}");
        assert_eq!(none["Managed"], serde_json::json!({}));
        let managed = crate::local::Managed {
            command: Vec::new(),
            token: structs::Token::new("reg"),
            local_token: structs::Token::new("local"),
        };
        let some = serde_json::to_value(service(Some("reg"), Some(managed.clone()))).unwrap();
        assert_eq!(some["Token"], "reg");
        assert_eq!(
            some["Managed"],
            serde_json::json!({"Token": "reg", "LocalToken": "local"})
        );
        let back: PersistedService = serde_json::from_value(some).unwrap();
        assert_eq!((back.token, back.managed), (structs::Token::new("reg"), Some(managed)));
        // Files that hold "" (as any writer may) load as none.
        let mut old = none;
        old["Token"] = "".into();
        old["Managed"] = serde_json::json!({"Token": "", "LocalToken": ""});
        let back: PersistedService = serde_json::from_value(old).unwrap();
        assert_eq!(
            (back.token, back.managed),
            (None, Some(crate::local::Managed::default()))
        );
    }
}
