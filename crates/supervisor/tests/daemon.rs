//! Managed daemons with real processes: the exact restart schedule of a crash loop (paused
//! tokio time; the processes are real), re-adoption across managers, pid reuse, stop,
//! snapshot and pid files, coalescing, the root check.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use supervisor::daemon::{DaemonEvent, DaemonSpec, DesiredSet, Manager, ManagerHandle, ManagerOptions};
use supervisor::process::ProcessId;
use tokio::sync::{broadcast, mpsc};
use tokio::time::Instant;

fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

fn spec(command: &Path, args: &[&str]) -> DaemonSpec {
    DaemonSpec {
        command: command.to_owned(),
        args: args.iter().map(|s| s.to_string()).collect(),
        env: BTreeMap::new(),
        token: structs::Token::new("secret-token"),
        sidecar_for: "web".into(),
    }
}

fn opts(dir: &Path) -> ManagerOptions {
    ManagerOptions {
        allow_root: true,
        ..ManagerOptions::new(dir.join("data"))
    }
}

fn start(
    o: ManagerOptions,
) -> (
    ManagerHandle,
    mpsc::Sender<DesiredSet>,
    broadcast::Receiver<DaemonEvent>,
) {
    let (tx, rx) = mpsc::channel(8);
    let h = Manager::start(o, rx).unwrap();
    let ev = h.events();
    (h, tx, ev)
}

async fn next_event(ev: &mut broadcast::Receiver<DaemonEvent>) -> DaemonEvent {
    tokio::time::timeout(Duration::from_secs(30), ev.recv())
        .await
        .expect("no daemon event in time")
        .unwrap()
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn set(entries: &[(&str, DaemonSpec)]) -> DesiredSet {
    entries.iter().map(|(id, s)| (id.to_string(), s.clone())).collect()
}

#[tokio::test(start_paused = true)]
async fn a_crash_loop_is_restarted_on_the_exact_schedule_with_the_proxy_environment() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let crash = script(
        dir.path(),
        "crash.sh",
        &format!(
            "echo \"$CONNECT_PROXY_ID $CONNECT_SIDECAR_FOR $CONNECT_PROXY_TOKEN\" >> {}\nexit 3",
            runs.display()
        ),
    );
    let (h, tx, mut ev) = start(opts(dir.path()));
    tx.send(set(&[("web-proxy", spec(&crash, &[]))])).await.unwrap();
    let mut starts = Vec::new();
    let mut t0 = None;
    while starts.len() < 10 {
        if let DaemonEvent::Started { attempt, .. } = next_event_paused(&mut ev).await {
            let t0 = *t0.get_or_insert_with(Instant::now);
            starts.push((attempt, t0.elapsed().as_secs()));
        }
    }
    // Attempts 1-3 at once, then 2^(n-3) s capped at 60 s.
    assert_eq!(
        starts,
        [
            (1, 0),
            (2, 0),
            (3, 0),
            (4, 2),
            (5, 6),
            (6, 14),
            (7, 30),
            (8, 62),
            (9, 122),
            (10, 182)
        ]
    );
    h.kill().await;
    let runs = lines(&runs);
    assert!(runs.len() >= 9, "the script really ran each time: {runs:?}");
    assert!(runs.iter().all(|l| l == "web-proxy web secret-token"), "{runs:?}");
    let data = dir.path().join("data");
    assert!(lines(&data.join("logs/web-proxy-stdout.log")).is_empty());
    assert!(
        !data.join("pids/web-proxy.pid").exists(),
        "pid file removed once stopped"
    );
}

/// Paused time: no timeout (it would fire while the real process runs).
async fn next_event_paused(ev: &mut broadcast::Receiver<DaemonEvent>) -> DaemonEvent {
    ev.recv().await.unwrap()
}

#[tokio::test]
async fn restore_re_adopts_a_running_daemon_without_restarting_it_and_restarts_it_when_it_dies() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let long = script(
        dir.path(),
        "long.sh",
        &format!(
            "echo started >> {}\necho out-line\necho err-line >&2\nexec sleep 1000",
            runs.display()
        ),
    );
    let o = ManagerOptions {
        quiescence: Duration::from_millis(20),
        ..opts(dir.path())
    };
    let (h, tx, mut ev) = start(o.clone());
    tx.send(set(&[("api-proxy", spec(&long, &[]))])).await.unwrap();
    let DaemonEvent::Started { pid, .. } = next_event(&mut ev).await else {
        panic!()
    };
    let data = dir.path().join("data");
    // Pid file, logs and the 0600 snapshot holding the token.
    assert_eq!(lines(&data.join("pids/api-proxy.pid")), [pid.to_string()]);
    let snap_path = data.join("snapshot.json");
    wait_until(|| {
        std::fs::read_to_string(&snap_path)
            .unwrap_or_default()
            .contains(&format!("\"pid\": {pid}"))
    })
    .await;
    let snap = std::fs::read_to_string(&snap_path).unwrap();
    assert!(snap.contains("secret-token"), "{snap}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&snap_path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    wait_until(|| lines(&data.join("logs/api-proxy-stderr.log")) == ["err-line"]).await;
    assert_eq!(lines(&data.join("logs/api-proxy-stdout.log")), ["out-line"]);

    // The supervisor goes away without stopping its daemons.
    drop(tx);
    h.close().await;
    let id = ProcessId::of(pid).unwrap();
    assert!(id.is_alive(), "close leaves the daemon running");

    // A new manager re-adopts it: same pid, the script did not run again.
    let (h2, _tx2, mut ev2) = start(o);
    assert_eq!(
        next_event(&mut ev2).await,
        DaemonEvent::Adopted {
            id: "api-proxy".into(),
            pid
        }
    );
    assert_eq!(lines(&runs), ["started"]);
    // It watches the adopted process: killed, it is restarted.
    supervisor::process::signal(pid, rustix::process::Signal::KILL).unwrap();
    assert_eq!(
        next_event(&mut ev2).await,
        DaemonEvent::Exited {
            id: "api-proxy".into(),
            pid,
            status: None,
        }
    );
    let DaemonEvent::Started { pid: pid2, attempt, .. } = next_event(&mut ev2).await else {
        panic!()
    };
    assert_ne!(pid2, pid);
    assert_eq!(attempt, 2, "the adoption counted as the first attempt");
    assert_eq!(lines(&data.join("pids/api-proxy.pid")), [pid2.to_string()]);
    h2.kill().await;
    wait_until(|| !ProcessId::of(pid2).is_some_and(|p| p.is_alive())).await;
    assert!(!data.join("pids/api-proxy.pid").exists());
}

#[tokio::test]
async fn a_reused_pid_is_not_adopted() {
    let dir = tempfile::tempdir().unwrap();
    let long = script(dir.path(), "long.sh", "exec sleep 1000");
    // An unrelated live process holds the pid the snapshot recorded, with another start time.
    let mut stranger = tokio::process::Command::new("sleep")
        .arg("1000")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let spid = stranger.id().unwrap();
    let real = ProcessId::of(spid).unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let snapshot = serde_json::json!({
        "version": 1,
        "proxies": {"db-proxy": {
            "spec": spec(&long, &[]),
            "process": {"pid": spid, "start_time": real.start_time + 1},
        }},
    });
    std::fs::write(data.join("snapshot.json"), snapshot.to_string()).unwrap();
    let (h, _tx, mut ev) = start(opts(dir.path()));
    let DaemonEvent::Started { pid, .. } = next_event(&mut ev).await else {
        panic!("expected a fresh start")
    };
    assert_ne!(pid, spid);
    assert!(real.is_alive(), "the stranger was neither adopted nor signalled");
    h.kill().await;
    assert!(real.is_alive());
    stranger.kill().await.unwrap();
}

#[tokio::test]
async fn leaving_the_desired_set_stops_with_sigint_and_an_unchanged_set_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let got = dir.path().join("got");
    let ready = dir.path().join("ready");
    // Python, not a shell trap: a non-interactive shell cannot trap a signal that was ignored
    // when it started (as SIGINT is under a runner started in the background), and the
    // daemon manager cannot reset dispositions without unsafe code; Python's handler can.
    let handler = dir.path().join("polite.py");
    std::fs::write(
        &handler,
        format!(
            "import signal, sys, time\n\
             def on_int(*_):\n    open({got:?}, 'a').write('INT\\n')\n    sys.exit(0)\n\
             signal.signal(signal.SIGINT, on_int)\n\
             open({ready:?}, 'w').write('up')\n\
             while True:\n    time.sleep(0.05)\n",
            got = got.display().to_string(),
            ready = ready.display().to_string()
        ),
    )
    .unwrap();
    let polite = script(dir.path(), "polite.sh", &format!("exec python3 {}", handler.display()));
    let o = ManagerOptions {
        quiescence: Duration::from_millis(20),
        ..opts(dir.path())
    };
    let (h, tx, mut ev) = start(o);
    let desired = set(&[("a", spec(&polite, &[]))]);
    tx.send(desired.clone()).await.unwrap();
    let DaemonEvent::Started { pid, .. } = next_event(&mut ev).await else {
        panic!()
    };
    let snap = dir.path().join("data/snapshot.json");
    wait_until(|| {
        std::fs::read_to_string(&snap)
            .unwrap_or_default()
            .contains(&pid.to_string())
    })
    .await;
    let before = std::fs::metadata(&snap).unwrap().modified().unwrap();
    tx.send(desired).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        std::fs::metadata(&snap).unwrap().modified().unwrap(),
        before,
        "same set: snapshot not rewritten"
    );

    // The handler must be installed before the stop: on a loaded machine the interpreter
    // can take longer to start than the steps above.
    wait_until(|| ready.exists()).await;
    tx.send(DesiredSet::new()).await.unwrap();
    assert_eq!(next_event(&mut ev).await, DaemonEvent::Stopped { id: "a".into() });
    assert_eq!(lines(&got), ["INT"], "stopped with SIGINT, not killed");
    assert!(!dir.path().join("data/pids/a.pid").exists());
    assert!(!std::fs::read_to_string(&snap).unwrap().contains("\"a\""));
    h.kill().await;
}

#[tokio::test(start_paused = true)]
async fn bursts_of_desired_sets_are_coalesced() {
    let dir = tempfile::tempdir().unwrap();
    let long = script(dir.path(), "long.sh", "exec sleep 1000");
    let (h, tx, mut ev) = start(opts(dir.path()));
    let t0 = Instant::now();
    // A change every 400 ms for 8 s: never 500 ms of quiet, so the 5 s cap applies.
    for i in 0..20 {
        tx.send(set(&[(&format!("p{i}"), spec(&long, &[]))])).await.unwrap();
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    let first = next_event_paused(&mut ev).await;
    let DaemonEvent::Started { id, .. } = &first else {
        panic!("{first:?}")
    };
    // Applied at the 5 s cap with the set current then (sent at 4.8 s): p12.
    assert_eq!(id, "p12");
    let started: Vec<String> = std::iter::once(id.clone())
        .chain(std::iter::from_fn(|| match ev.try_recv() {
            Ok(DaemonEvent::Started { id, .. }) => Some(id),
            _ => None,
        }))
        .collect();
    assert!(
        !started.iter().any(|i| i == "p0" || i == "p5"),
        "intermediate sets never ran: {started:?}"
    );
    assert!(t0.elapsed() >= Duration::from_secs(8));
    h.kill().await;
}

#[tokio::test]
async fn proxies_are_not_started_as_root_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let long = script(dir.path(), "long.sh", "exec sleep 1000");
    let o = ManagerOptions {
        allow_root: false,
        quiescence: Duration::from_millis(10),
        ..opts(dir.path())
    };
    let (h, tx, mut ev) = start(o);
    tx.send(set(&[("r", spec(&long, &[]))])).await.unwrap();
    match next_event(&mut ev).await {
        DaemonEvent::Failed { id, reason } if rustix::process::geteuid().is_root() => {
            assert_eq!(id, "r");
            assert!(reason.contains("-allow-managed-root"), "names the flag: {reason}");
            assert!(!dir.path().join("data/pids/r.pid").exists());
            // Said once: no retry follows (the old loop retried at once, 3 times).
            let again = tokio::time::timeout(Duration::from_millis(500), ev.recv()).await;
            assert!(again.is_err(), "a second event: {again:?}");
        }
        DaemonEvent::Started { .. } if !rustix::process::geteuid().is_root() => {}
        other => panic!("unexpected {other:?}"),
    }
    h.kill().await;
}

async fn wait_until(mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(std::time::Instant::now() < deadline, "condition not met in 10 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
