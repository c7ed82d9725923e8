//! The proxy agent's state machine against a scripted fake proxy, in paused tokio time: the
//! exact back-off schedule, budget reset, epoch reuse, abort-all, panic, live waits, drain.
#![allow(clippy::unwrap_used)]

use parking_lot::Mutex;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use supervisor::agent::{Agent, AgentError, AgentHandle, AgentOptions, Proxy, ProxyError, Retry};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Ev {
    Start {
        epoch: u32,
        config: &'static str,
        at: Duration,
    },
    Aborted {
        epoch: u32,
    },
    Cleanup {
        epoch: u32,
    },
    Drain {
        epoch: u32,
    },
    Panic {
        config: &'static str,
    },
}

#[derive(Clone, Copy)]
enum Behavior {
    /// Returns `Err(Start)` at once.
    FailStart,
    /// Live at once; runs until aborted or told to exit.
    Run,
    /// Runs, but is live only when the test says so.
    RunNotLive,
    /// The run future panics (a bug in a proxy implementation).
    Panic,
}

struct Fake {
    t0: Instant,
    log: Mutex<Vec<Ev>>,
    script: Mutex<VecDeque<Behavior>>,
    default: Behavior,
    exits: Mutex<BTreeMap<u32, oneshot::Sender<Result<(), ProxyError>>>>,
    live: Mutex<BTreeMap<u32, watch::Sender<bool>>>,
}

#[derive(Clone)]
struct Shared(Arc<Fake>);

impl Shared {
    fn new(default: Behavior, script: &[Behavior]) -> Self {
        Shared(Arc::new(Fake {
            t0: Instant::now(),
            log: Mutex::new(Vec::new()),
            script: Mutex::new(script.iter().copied().collect()),
            default,
            exits: Mutex::new(BTreeMap::new()),
            live: Mutex::new(BTreeMap::new()),
        }))
    }
    fn log(&self) -> Vec<Ev> {
        self.0.log.lock().clone()
    }
    fn starts(&self) -> Vec<(u32, &'static str, Duration)> {
        self.log()
            .into_iter()
            .filter_map(|e| match e {
                Ev::Start { epoch, config, at } => Some((epoch, config, at)),
                _ => None,
            })
            .collect()
    }
    fn exit(&self, epoch: u32, result: Result<(), ProxyError>) {
        self.0.exits.lock().remove(&epoch).unwrap().send(result).unwrap();
    }
    fn set_live(&self, epoch: u32) {
        self.0.live.lock().get(&epoch).unwrap().send_replace(true);
    }
    fn live_rx(&self, epoch: u32) -> watch::Receiver<bool> {
        self.0
            .live
            .lock()
            .entry(epoch)
            .or_insert_with(|| watch::channel(false).0)
            .subscribe()
    }
}

impl Proxy for Shared {
    type Config = &'static str;

    async fn run(&self, config: &&'static str, epoch: u32, abort: CancellationToken) -> Result<(), ProxyError> {
        let f = &self.0;
        f.log.lock().push(Ev::Start {
            epoch,
            config,
            at: f.t0.elapsed(),
        });
        let behavior = f.script.lock().pop_front().unwrap_or(f.default);
        let live_now = match behavior {
            Behavior::FailStart => return Err(ProxyError::Start(format!("scripted failure of epoch {epoch}"))),
            Behavior::Run => true,
            Behavior::RunNotLive => false,
            Behavior::Panic => panic!("scripted panic in epoch {epoch}"),
        };
        f.live.lock().insert(epoch, watch::channel(live_now).0);
        let (tx, rx) = oneshot::channel();
        f.exits.lock().insert(epoch, tx);
        tokio::select! {
            r = rx => r.unwrap(),
            _ = abort.cancelled() => {
                f.log.lock().push(Ev::Aborted { epoch });
                f.exits.lock().remove(&epoch);
                Ok(())
            }
        }
    }

    async fn wait_live(&self, epoch: u32) {
        let mut rx = self.live_rx(epoch);
        let _ = rx.wait_for(|live| *live).await;
    }

    async fn drain(&self, epoch: u32) -> Result<(), ProxyError> {
        self.0.log.lock().push(Ev::Drain { epoch });
        Ok(())
    }

    fn cleanup(&self, epoch: u32) {
        self.0.log.lock().push(Ev::Cleanup { epoch });
    }

    fn panic(&self, config: &&'static str) {
        self.0.log.lock().push(Ev::Panic { config });
    }
}

type Running = (
    AgentHandle<&'static str>,
    tokio::task::JoinHandle<Result<(), AgentError>>,
    CancellationToken,
);

fn spawn(fake: &Shared, opts: AgentOptions) -> Running {
    let (agent, handle) = Agent::new(fake.clone(), opts);
    let cancel = CancellationToken::new();
    let task = tokio::spawn(agent.run(cancel.clone()));
    (handle, task, cancel)
}

/// An agent whose config went "a" then "b": epochs 0 and 1 running (with `Behavior::Run`).
async fn two_epochs(fake: &Shared, opts: AgentOptions) -> Running {
    let running = spawn(fake, opts);
    running.0.set_config("a").await.unwrap();
    settle().await;
    running.0.set_config("b").await.unwrap();
    settle().await;
    running
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

async fn settle() {
    // Let every ready task run without moving the clock past pending timers' work.
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn failed_starts_follow_the_exact_backoff_then_panic() {
    let fake = Shared::new(Behavior::FailStart, &[]);
    let (handle, task, _cancel) = spawn(&fake, AgentOptions::default());
    handle.set_config("a").await.unwrap();
    let err = task.await.unwrap().unwrap_err();
    let AgentError::BudgetExhausted { retries, last, .. } = err;
    assert_eq!(retries, 11, "the failure that spent the budget counts");
    assert!(matches!(last, ProxyError::Start(_)));
    let starts = fake.starts();
    // 1 start + 10 retries, every one reusing epoch 0; delays 200 ms doubling up to 10 s.
    let mut expect = Vec::new();
    let mut at = 0;
    for n in 0..11 {
        expect.push((0, "a", ms(at)));
        at += (200 << n).min(10_000);
    }
    assert_eq!(starts, expect);
    assert_eq!(fake.log().last(), Some(&Ev::Panic { config: "a" }));
}

#[tokio::test(start_paused = true)]
async fn a_new_config_resets_the_budget() {
    let fake = Shared::new(Behavior::FailStart, &[]);
    let retry = Retry {
        max_retries: 3,
        initial_interval: ms(100),
        ..Retry::default()
    };
    let (handle, task, _cancel) = spawn(
        &fake,
        AgentOptions {
            retry,
            ..AgentOptions::default()
        },
    );
    handle.set_config("a").await.unwrap();
    // Starts at 0, 100, 300 ms; at 500 ms a new config arrives before the last retry (700).
    tokio::time::sleep(ms(500)).await;
    handle.set_config("b").await.unwrap();
    let _ = task.await.unwrap().unwrap_err();
    let starts: Vec<_> = fake
        .starts()
        .into_iter()
        .map(|(_, c, at)| (c, at.as_millis()))
        .collect();
    // "b" starts at once, then a full new budget of 3 retries: +100, +200, +400.
    assert_eq!(
        starts,
        [
            ("a", 0),
            ("a", 100),
            ("a", 300),
            ("b", 500),
            ("b", 600),
            ("b", 800),
            ("b", 1200)
        ]
    );
    assert_eq!(fake.log().last(), Some(&Ev::Panic { config: "b" }));
}

#[tokio::test(start_paused = true)]
async fn a_failed_hot_restart_reuses_the_epoch_and_keeps_the_old_one_serving() {
    let fake = Shared::new(
        Behavior::Run,
        &[Behavior::Run, Behavior::FailStart, Behavior::FailStart],
    );
    let (handle, _task, cancel) = spawn(&fake, AgentOptions::default());
    handle.set_config("a").await.unwrap();
    settle().await;
    handle.set_config("b").await.unwrap();
    tokio::time::sleep(ms(5_000)).await;
    let starts = fake.starts();
    assert_eq!(
        starts,
        [(0, "a", ms(0)), (1, "b", ms(0)), (1, "b", ms(200)), (1, "b", ms(600))]
    );
    // Epoch 0 was never aborted; epoch 1 now runs beside it.
    assert!(!fake.log().contains(&Ev::Aborted { epoch: 0 }));
    assert_eq!(handle.status().borrow().running, [0, 1]);
    cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_crash_of_a_running_epoch_aborts_all_and_restarts_from_epoch_zero() {
    let fake = Shared::new(Behavior::Run, &[]);
    let (handle, _task, cancel) = two_epochs(&fake, AgentOptions::default()).await;
    assert_eq!(handle.status().borrow().running, [0, 1]);
    tokio::time::sleep(ms(1_000)).await;
    fake.exit(1, Err(ProxyError::Exited("signal 11".into())));
    tokio::time::sleep(ms(1_000)).await;
    let log = fake.log();
    assert!(log.contains(&Ev::Aborted { epoch: 0 }), "{log:?}");
    assert!(log.contains(&Ev::Cleanup { epoch: 0 }) && log.contains(&Ev::Cleanup { epoch: 1 }));
    // Restart after the first back-off step, at epoch 0, with the desired config.
    assert_eq!(fake.starts().last(), Some(&(0, "b", ms(1_200))));
    assert_eq!(handle.status().borrow().running, [0]);
    cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn the_latest_epoch_exiting_cleanly_is_unexpected_but_an_old_one_is_not() {
    let fake = Shared::new(Behavior::Run, &[]);
    let (handle, _task, cancel) = two_epochs(&fake, AgentOptions::default()).await;
    // The parent of a hot restart exits 0: that is how a hot restart ends.
    fake.exit(0, Ok(()));
    tokio::time::sleep(ms(1_000)).await;
    assert_eq!(fake.starts().len(), 2);
    assert_eq!(handle.status().borrow().running, [1]);
    // The latest exits 0 on its own: the proxy is gone, so it is restarted.
    fake.exit(1, Ok(()));
    tokio::time::sleep(ms(1_000)).await;
    assert_eq!(fake.starts().last(), Some(&(0, "b", ms(1_200))));
    cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn the_next_epoch_waits_for_the_previous_to_be_live_within_a_bound() {
    let fake = Shared::new(Behavior::Run, &[Behavior::RunNotLive, Behavior::RunNotLive]);
    let opts = AgentOptions {
        live_timeout: ms(3_000),
        ..AgentOptions::default()
    };
    let (handle, _task, cancel) = spawn(&fake, opts);
    handle.set_config("a").await.unwrap();
    settle().await;
    handle.set_config("b").await.unwrap();
    tokio::time::sleep(ms(1_000)).await;
    assert_eq!(fake.starts().len(), 1, "epoch 1 must wait for epoch 0 to be live");
    fake.set_live(0);
    settle().await;
    assert_eq!(fake.starts().last(), Some(&(1, "b", ms(1_000))));
    // Epoch 1 never turns live: epoch 2 starts anyway once the bound passes.
    handle.set_config("c").await.unwrap();
    tokio::time::sleep(ms(10_000)).await;
    assert_eq!(fake.starts().last(), Some(&(2, "c", ms(4_000))));
    cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn drain_asks_the_latest_epoch_waits_the_period_then_stops_everything() {
    let fake = Shared::new(Behavior::Run, &[]);
    let opts = AgentOptions {
        drain_period: ms(2_000),
        ..AgentOptions::default()
    };
    let (handle, task, _cancel) = two_epochs(&fake, opts).await;
    let t0 = Instant::now();
    handle.drain().await.unwrap();
    assert!(fake.log().contains(&Ev::Drain { epoch: 1 }));
    // Still running during the drain period; configs are ignored while draining.
    tokio::time::sleep(ms(1_000)).await;
    assert_eq!(handle.status().borrow().running, [0, 1]);
    task.await.unwrap().unwrap();
    assert_eq!(t0.elapsed(), ms(2_000));
    let log = fake.log();
    for epoch in [0, 1] {
        assert!(
            log.contains(&Ev::Aborted { epoch }) && log.contains(&Ev::Cleanup { epoch }),
            "{log:?}"
        );
    }
    assert_eq!(fake.starts().len(), 2, "nothing restarted after the drain");
}

#[tokio::test(start_paused = true)]
async fn cancelling_stops_every_epoch_and_returns_cleanly() {
    let fake = Shared::new(Behavior::Run, &[]);
    let (handle, task, cancel) = spawn(&fake, AgentOptions::default());
    handle.set_config("a").await.unwrap();
    settle().await;
    cancel.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(fake.log()[1..], [Ev::Aborted { epoch: 0 }, Ev::Cleanup { epoch: 0 }]);
    assert!(
        handle.set_config("b").await.is_err(),
        "the handle reports the agent gone"
    );
}

#[tokio::test(start_paused = true)]
async fn the_same_config_again_changes_nothing() {
    let fake = Shared::new(Behavior::Run, &[]);
    let (handle, _task, cancel) = spawn(&fake, AgentOptions::default());
    handle.set_config("a").await.unwrap();
    handle.set_config("a").await.unwrap();
    tokio::time::sleep(ms(100)).await;
    assert_eq!(fake.starts(), [(0, "a", ms(0))]);
    cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_panicking_epoch_task_counts_as_a_crash_of_that_epoch() {
    let fake = Shared::new(Behavior::Run, &[Behavior::Panic]);
    let (handle, _task, cancel) = spawn(&fake, AgentOptions::default());
    handle.set_config("a").await.unwrap();
    tokio::time::sleep(ms(1_000)).await;
    // Epoch 0's task panicked: restarted after the first back-off step, at epoch 0.
    assert_eq!(fake.starts(), [(0, "a", ms(0)), (0, "a", ms(200))]);
    assert!(fake.log().contains(&Ev::Cleanup { epoch: 0 }));
    assert_eq!(handle.status().borrow().running, [0]);
    cancel.cancel();
}

/// The latest epoch of `fake` (epoch 0: every crash restarts from it) crashes.
fn crash(fake: &Shared, why: &str) {
    fake.exit(0, Err(ProxyError::Exited(why.into())));
}

#[tokio::test(start_paused = true)]
async fn an_envoy_killed_every_30_s_is_restarted_for_ever() {
    // The attack: `/quitquitquit` every 30 s. A budget counted since the config was set ran
    // out after 10 kills (about 7 minutes) and the proxy stayed down.
    let fake = Shared::new(Behavior::Run, &[]);
    let (handle, task, cancel) = spawn(&fake, AgentOptions::default());
    handle.set_config("a").await.unwrap();
    settle().await;
    for kill in 1..=60 {
        tokio::time::sleep(ms(20_000)).await;
        crash(&fake, "quitquitquit");
        // Back within the longest back-off.
        tokio::time::sleep(ms(10_000)).await;
        assert!(
            !task.is_finished(),
            "gave up after {kill} kills: {:?}",
            fake.log().last()
        );
        assert_eq!(handle.status().borrow().running, [0], "kill {kill}");
    }
    assert_eq!(fake.starts().len(), 61);
    assert!(!fake.log().iter().any(|e| matches!(e, Ev::Panic { .. })));
    cancel.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_crash_loop_still_gives_up_within_the_window() {
    // Live, then crashing 2 s later, every time.
    let fake = Shared::new(Behavior::Run, &[]);
    let (handle, mut task, _cancel) = spawn(&fake, AgentOptions::default());
    handle.set_config("a").await.unwrap();
    let t0 = Instant::now();
    let err = loop {
        tokio::time::sleep(ms(2_000)).await;
        if fake.0.exits.lock().contains_key(&0) {
            crash(&fake, "signal 11");
        }
        if let Ok(ended) = tokio::time::timeout(ms(1), &mut task).await {
            break ended.unwrap().unwrap_err();
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "no end to the crash loop");
    };
    let AgentError::BudgetExhausted { retries, window, last } = err;
    assert_eq!((retries, window), (11, Duration::from_secs(120)));
    assert_eq!(last, ProxyError::Exited("signal 11".into()));
    assert_eq!(fake.starts().len(), 11);
    assert_eq!(fake.log().last(), Some(&Ev::Panic { config: "a" }));
}

#[tokio::test(start_paused = true)]
async fn failures_older_than_the_window_no_longer_count() {
    let fake = Shared::new(Behavior::Run, &[]);
    let retry = Retry {
        max_retries: 3,
        window: ms(60_000),
        ..Retry::default()
    };
    let opts = AgentOptions {
        retry,
        // Out of the way: only the window forgets failures here.
        healthy_after: Duration::MAX,
        ..AgentOptions::default()
    };
    let (handle, task, cancel) = spawn(&fake, opts);
    handle.set_config("a").await.unwrap();
    settle().await;
    // Three crashes 25 s apart fit in the budget; the back-off grows with each.
    let mut crashes = Vec::new();
    for delay in [200, 400, 800] {
        tokio::time::sleep(ms(25_000)).await;
        crashes.push(fake.0.t0.elapsed());
        crash(&fake, "killed");
        tokio::time::sleep(ms(1_000)).await;
        assert_eq!(fake.starts().last().unwrap().2, *crashes.last().unwrap() + ms(delay));
    }
    // A fourth within 60 s of the first would end it; 60 s after the first, that one is
    // forgotten and the back-off is that of a third failure.
    tokio::time::sleep_until(fake.0.t0 + crashes[0] + ms(60_000)).await;
    crash(&fake, "killed");
    tokio::time::sleep(ms(1_000)).await;
    assert!(!task.is_finished());
    assert_eq!(fake.starts().last().unwrap().2, crashes[0] + ms(60_800));
    cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_healthy_stretch_clears_the_count_and_a_slow_failed_start_does_not() {
    let fake = Shared::new(Behavior::Run, &[]);
    let (handle, _task, cancel) = spawn(&fake, AgentOptions::default());
    handle.set_config("a").await.unwrap();
    settle().await;
    let last_start = |fake: &Shared| fake.starts().last().unwrap().2;
    // Three quick crashes: the back-off grows to 800 ms.
    for _ in 0..3 {
        tokio::time::sleep(ms(1_000)).await;
        crash(&fake, "killed");
        tokio::time::sleep(ms(1_000)).await;
    }
    // A start that fails after 61 s proves nothing healthy: a fourth failure, 1.6 s.
    tokio::time::sleep(ms(61_000)).await;
    let failed = fake.0.t0.elapsed();
    fake.exit(0, Err(ProxyError::Start("never live".into())));
    tokio::time::sleep(ms(2_000)).await;
    assert_eq!(last_start(&fake), failed + ms(1_600));
    // A crash after 61 s of running: a first failure again, retried after 200 ms.
    tokio::time::sleep(ms(61_000)).await;
    let failed = fake.0.t0.elapsed();
    crash(&fake, "killed");
    tokio::time::sleep(ms(1_000)).await;
    assert_eq!(last_start(&fake), failed + ms(200));
    cancel.cancel();
}
