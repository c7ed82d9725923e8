//! The proxy agent: one logical proxy (Envoy) kept at its desired config through restart
//! epochs, after Istio's Envoy agent.
//!
//! The agent owns a control loop and one task per running epoch. A desired config arrives
//! through an [`AgentHandle`]; when it differs from the current one the failures counted so
//! far are forgotten and epoch latest+1 starts (after the latest is live, bounded by
//! [`AgentOptions::live_timeout`]), which for Envoy is a hot restart. Exits are classified:
//!
//! - a failed start (the proxy never became live): retried with exponential back-off reusing
//!   the same epoch number; older epochs keep serving;
//! - an unexpected exit of a running epoch (an error, or the latest epoch exiting at all):
//!   every epoch is aborted and a restart is scheduled with back-off, from epoch 0 once all
//!   aborted epochs are gone;
//! - a clean exit of an older epoch: the normal end of a hot restart.
//!
//! Failures count within a sliding window ([`Retry`]): more than `max_retries` of them within
//! `window` is a crash loop, which calls [`Proxy::panic`] and ends the agent with
//! [`AgentError::BudgetExhausted`]; an epoch that ran [`AgentOptions::healthy_after`] before it
//! crashed clears the count. So a proxy killed now and then is restarted for ever. Drain asks the latest epoch to drain gracefully, waits the
//! drain period, stops every epoch and ends. Cancelling the agent stops every epoch and ends.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// Restart back-off and budget: a proxy that fails more than `max_retries` times within any
/// `window` is given up on (a crash loop); one that fails less often is restarted for ever.
/// Retry n (0-based, n = failures already in the window) waits `initial_interval * 2^n`, at
/// most `max_interval`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// Failures tolerated within `window`: the next one ends the agent.
    pub max_retries: u32,
    /// How far back failures count: older ones are forgotten.
    pub window: Duration,
    /// Delay before the first retry; each later one doubles it.
    pub initial_interval: Duration,
    /// The longest delay before a retry.
    pub max_interval: Duration,
}

impl Default for Retry {
    /// 10 failures within 2 minutes; 200 ms doubling up to 10 s. A crash loop (failing at
    /// once) gives up after about a minute; an Envoy killed every 30 s is never given up on.
    fn default() -> Self {
        Self {
            max_retries: 10,
            window: Duration::from_secs(120),
            initial_interval: Duration::from_millis(200),
            max_interval: Duration::from_secs(10),
        }
    }
}

impl Retry {
    /// The delay before retry number `n` (0-based): `initial_interval * 2^n`, at most
    /// `max_interval`.
    pub fn delay(&self, n: u32) -> Duration {
        let schedule = backoff_schedule::Schedule {
            immediate: 0,
            first: self.initial_interval,
            max: self.max_interval,
        };
        schedule.delay(n.saturating_add(1))
    }
}

/// The failures of the desired config that still count: those within the retry window, since
/// the config was set and since the last stretch of healthy running.
#[derive(Debug, Default)]
struct Failures {
    at: VecDeque<Instant>,
}

impl Failures {
    /// Forgets every failure (a new config, or a proxy that ran healthily).
    fn clear(&mut self) {
        self.at.clear();
    }

    /// Records a failure at `now`: the delay before the retry, or `None` when more than
    /// `max_retries` failures fall within the window.
    fn record(&mut self, now: Instant, retry: &Retry) -> Option<Duration> {
        while self.at.front().is_some_and(|t| now.duration_since(*t) >= retry.window) {
            self.at.pop_front();
        }
        self.at.push_back(now);
        let earlier = u32::try_from(self.at.len() - 1).unwrap_or(u32::MAX);
        (earlier < retry.max_retries).then(|| retry.delay(earlier))
    }

    /// Failures in the window.
    fn len(&self) -> usize {
        self.at.len()
    }
}

/// Why a proxy epoch ended badly.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProxyError {
    /// The epoch never became live (bad config, hot restart refused, binary missing...).
    #[error("failed to start: {0}")]
    Start(String),
    /// The epoch was running and exited with an error.
    #[error("exited: {0}")]
    Exited(String),
}

/// One logical proxy binary, as the agent drives it. Envoy is [`crate::envoy::EnvoyProxy`];
/// tests use a fake.
pub trait Proxy: Send + Sync + 'static {
    /// The desired configuration (for Envoy: its bootstrap).
    type Config: Clone + PartialEq + fmt::Debug + Send + Sync + 'static;

    /// Runs epoch `epoch` with `config` until it exits. When `abort` is cancelled the proxy
    /// must stop promptly. `Err(Start)` means it never became live.
    fn run(
        &self,
        config: &Self::Config,
        epoch: u32,
        abort: CancellationToken,
    ) -> impl Future<Output = Result<(), ProxyError>> + Send;

    /// Resolves once epoch `epoch` is live (serving). The agent bounds the wait.
    fn wait_live(&self, epoch: u32) -> impl Future<Output = ()> + Send {
        let _ = epoch;
        async {}
    }

    /// Starts a graceful drain of epoch `epoch` (stop accepting, let requests finish).
    fn drain(&self, epoch: u32) -> impl Future<Output = Result<(), ProxyError>> + Send {
        let _ = epoch;
        async { Ok(()) }
    }

    /// Cleans up after epoch `epoch` exited. Called on the control loop: must not block.
    fn cleanup(&self, epoch: u32);

    /// Called with the desired config when every retry has failed, before the agent ends.
    fn panic(&self, config: &Self::Config);
}

/// Agent tuning.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// Back-off and budget.
    pub retry: Retry,
    /// How long epoch N+1 waits for epoch N to be live before starting anyway.
    pub live_timeout: Duration,
    /// How long a drain lets connections finish before the epochs are stopped.
    pub drain_period: Duration,
    /// An epoch that ran this long before it crashed clears the failures counted so far:
    /// the retry that follows is a first one again. A failed start never does.
    pub healthy_after: Duration,
}

impl Default for AgentOptions {
    fn default() -> Self {
        Self {
            retry: Retry::default(),
            live_timeout: Duration::from_secs(20),
            drain_period: Duration::from_secs(5),
            healthy_after: Duration::from_secs(60),
        }
    }
}

/// How the agent ended badly.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgentError {
    /// The proxy failed more than the budget allows within the retry window: a crash loop.
    #[error("gave up: the proxy failed {retries} times within {window:?} (a crash loop); last: {last}")]
    BudgetExhausted {
        /// Failures within the window.
        retries: u32,
        /// The retry window.
        window: Duration,
        /// The last failure.
        last: ProxyError,
    },
}

/// The agent's handle was used after the agent ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the proxy agent has stopped")]
pub struct AgentGone;

/// What the agent is doing, published on every change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentStatus {
    /// Epochs with a running task, oldest first.
    pub running: Vec<u32>,
    /// Epochs started so far (every attempt counts).
    pub starts: u64,
    /// A restart is scheduled (back-off pending).
    pub restart_pending: bool,
    /// Draining before exit.
    pub draining: bool,
}

enum Command<C> {
    Config(C),
    Drain(oneshot::Sender<()>),
}

/// Sends desired configs and drain requests to an [`Agent`].
pub struct AgentHandle<C> {
    tx: mpsc::Sender<Command<C>>,
    status: watch::Receiver<AgentStatus>,
}

impl<C> Clone for AgentHandle<C> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
            status: self.status.clone(),
        }
    }
}

impl<C: Send + 'static> AgentHandle<C> {
    /// Sets the desired config. Waits until the control loop has taken it.
    pub async fn set_config(&self, config: C) -> Result<(), AgentGone> {
        self.tx.send(Command::Config(config)).await.map_err(|_| AgentGone)
    }

    /// Drains the proxy and stops it; resolves when the drain has started. The agent's `run`
    /// returns once the drain period is over and every epoch has exited.
    pub async fn drain(&self) -> Result<(), AgentGone> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Command::Drain(tx)).await.map_err(|_| AgentGone)?;
        rx.await.map_err(|_| AgentGone)
    }

    /// The agent's status, updated on every change.
    pub fn status(&self) -> watch::Receiver<AgentStatus> {
        self.status.clone()
    }
}

struct Epoch<C> {
    config: C,
    /// The epoch's task, to tell which epoch a panicked task ran.
    task: tokio::task::Id,
    abort: CancellationToken,
    aborted: bool,
    started: Instant,
}

/// One logical proxy kept at its desired config. See the module docs.
pub struct Agent<P: Proxy> {
    proxy: Arc<P>,
    opts: AgentOptions,
    rx: mpsc::Receiver<Command<P::Config>>,
    status: watch::Sender<AgentStatus>,
    epochs: BTreeMap<u32, Epoch<P::Config>>,
    /// Each epoch task ends with its epoch, how it ended and how long the proxy ran.
    tasks: JoinSet<(u32, Result<(), ProxyError>, Duration)>,
    desired: Option<P::Config>,
    failures: Failures,
    restart_at: Option<Instant>,
    /// A reconcile is waiting for aborted epochs to exit.
    reconcile_when_clear: bool,
    starts: u64,
}

impl<P: Proxy> Agent<P> {
    /// An agent for `proxy` and the handle that feeds it.
    pub fn new(proxy: P, opts: AgentOptions) -> (Self, AgentHandle<P::Config>) {
        let (tx, rx) = mpsc::channel(1);
        let (status, status_rx) = watch::channel(AgentStatus::default());
        let agent = Self {
            proxy: Arc::new(proxy),
            opts,
            rx,
            status,
            epochs: BTreeMap::new(),
            tasks: JoinSet::new(),
            desired: None,
            failures: Failures::default(),
            restart_at: None,
            reconcile_when_clear: false,
            starts: 0,
        };
        (agent, AgentHandle { tx, status: status_rx })
    }

    /// Runs the control loop until drained, cancelled, or out of retries. Every epoch has
    /// exited (and been cleaned up) when this returns.
    pub async fn run(mut self, cancel: CancellationToken) -> Result<(), AgentError> {
        let mut inbox_open = true;
        let mut drain_until: Option<Instant> = None;
        loop {
            self.publish(drain_until.is_some());
            let restart_at = self.restart_at;
            tokio::select! {
                biased;
                _ = cancel.cancelled() => {
                    tracing::info!("proxy agent cancelled: stopping every epoch");
                    self.stop_all().await;
                    return Ok(());
                }
                Some(joined) = self.tasks.join_next() => {
                    let (epoch, result, ran) = match joined {
                        Ok(r) => r,
                        // A panicking run task: a crash of the epoch it ran.
                        Err(e) => {
                            tracing::error!(error = %e, "proxy epoch task failed");
                            let id = e.id();
                            let Some(epoch) = self.epochs.iter().find(|(_, r)| r.task == id).map(|(n, _)| *n) else {
                                continue;
                            };
                            let ran = self.epochs.get(&epoch).map(|r| r.started.elapsed()).unwrap_or_default();
                            (epoch, Err(ProxyError::Exited(format!("the epoch's task failed: {e}"))), ran)
                        }
                    };
                    if let Err(last) = self.on_exit(epoch, result, ran, drain_until.is_some()) {
                        self.stop_all().await;
                        return Err(last);
                    }
                }
                cmd = self.rx.recv(), if inbox_open && drain_until.is_none() => match cmd {
                    None => inbox_open = false,
                    Some(Command::Config(config)) => {
                        if self.desired.as_ref() != Some(&config) {
                            tracing::info!("proxy agent: new desired config");
                            self.desired = Some(config);
                            self.failures.clear();
                            // Any scheduled retry was for the old config.
                            self.restart_at = None;
                            self.reconcile();
                        }
                    }
                    Some(Command::Drain(ack)) => {
                        self.restart_at = None;
                        if let Some(latest) = self.live_epochs().last().copied() {
                            tracing::info!(epoch = latest, "proxy agent: draining");
                            if let Err(e) = self.proxy.drain(latest).await {
                                tracing::warn!(epoch = latest, error = %e, "drain request failed; waiting anyway");
                            }
                        }
                        drain_until = Some(Instant::now() + self.opts.drain_period);
                        let _ = ack.send(());
                    }
                },
                _ = sleep_until_opt(restart_at) => {
                    self.restart_at = None;
                    self.reconcile();
                }
                _ = sleep_until_opt(drain_until) => {
                    tracing::info!("proxy agent: drain period over, stopping");
                    self.stop_all().await;
                    return Ok(());
                }
            }
        }
    }

    fn publish(&self, draining: bool) {
        let status = AgentStatus {
            running: self.epochs.keys().copied().collect(),
            starts: self.starts,
            restart_pending: self.restart_at.is_some() || self.reconcile_when_clear,
            draining,
        };
        self.status.send_if_modified(|s| {
            let changed = *s != status;
            *s = status;
            changed
        });
    }

    fn live_epochs(&self) -> Vec<u32> {
        self.epochs
            .iter()
            .filter(|(_, e)| !e.aborted)
            .map(|(n, _)| *n)
            .collect()
    }

    /// Starts epoch latest+1 with the desired config unless the latest already runs it.
    fn reconcile(&mut self) {
        let Some(desired) = self.desired.clone() else { return };
        let live = self.live_epochs();
        let current = live.last().and_then(|n| self.epochs.get(n)).map(|e| &e.config);
        if current == Some(&desired) {
            return;
        }
        if self.epochs.values().any(|e| e.aborted) {
            // A hot restart needs a healthy parent: wait until aborted epochs are gone.
            self.reconcile_when_clear = true;
            return;
        }
        self.reconcile_when_clear = false;
        let parent = live.last().copied();
        let epoch = parent.map_or(0, |p| p + 1);
        let abort = CancellationToken::new();
        let record_abort = abort.clone();
        let config = desired.clone();
        self.starts += 1;
        tracing::info!(epoch, "starting proxy epoch");
        let proxy = Arc::clone(&self.proxy);
        let live_timeout = self.opts.live_timeout;
        let task = self.tasks.spawn(
            async move {
                if let Some(parent) = parent {
                    tokio::select! {
                        _ = abort.cancelled() => return (epoch, Err(ProxyError::Start("aborted before start".into())), Duration::ZERO),
                        r = tokio::time::timeout(live_timeout, proxy.wait_live(parent)) => {
                            if r.is_err() {
                                tracing::warn!(epoch, parent, "parent epoch not live in time; starting anyway");
                            }
                        }
                    }
                }
                let started = Instant::now();
                let result = proxy.run(&desired, epoch, abort).await;
                (epoch, result, started.elapsed())
            }
            .instrument(tracing::info_span!("proxy_epoch", epoch)),
        );
        // Recorded before the loop looks at exits again, so the task's exit always finds it.
        let record = Epoch {
            config,
            task: task.id(),
            abort: record_abort,
            aborted: false,
            started: Instant::now(),
        };
        self.epochs.insert(epoch, record);
    }

    /// Aborts every epoch; `failure` says whether this is a reaction to a failure (logged as
    /// a warning) or a planned stop.
    fn abort_all(&mut self, failure: bool) {
        for (n, e) in &mut self.epochs {
            if !e.aborted {
                if failure {
                    tracing::warn!(epoch = n, "aborting proxy epoch");
                } else {
                    tracing::info!(epoch = n, "stopping proxy epoch");
                }
                e.aborted = true;
                e.abort.cancel();
            }
        }
    }

    /// Handles the exit of `epoch`, which ran for `ran`. `Err` ends the agent (budget
    /// exhausted).
    fn on_exit(
        &mut self,
        epoch: u32,
        result: Result<(), ProxyError>,
        ran: Duration,
        draining: bool,
    ) -> Result<(), AgentError> {
        let latest = self.live_epochs().last().copied();
        let Some(record) = self.epochs.remove(&epoch) else {
            return Ok(());
        };
        self.proxy.cleanup(epoch);
        if record.aborted || draining {
            tracing::info!(epoch, ?result, "proxy epoch stopped");
            if self.reconcile_when_clear && !self.epochs.values().any(|e| e.aborted) {
                self.reconcile();
            }
            return Ok(());
        }
        let failure = match result {
            Err(ProxyError::Start(reason)) => {
                // Older epochs keep serving; the same epoch number is tried again.
                tracing::warn!(epoch, %reason, "proxy epoch failed to start");
                ProxyError::Start(reason)
            }
            Err(ProxyError::Exited(reason)) => {
                tracing::warn!(epoch, %reason, "proxy epoch exited with an error: aborting all epochs");
                self.abort_all(true);
                ProxyError::Exited(reason)
            }
            Ok(()) if Some(epoch) != latest => {
                tracing::info!(epoch, "older proxy epoch exited normally");
                return Ok(());
            }
            Ok(()) => {
                tracing::warn!(epoch, "the latest proxy epoch exited unexpectedly: aborting all epochs");
                self.abort_all(true);
                ProxyError::Exited("the latest epoch exited with status 0".into())
            }
        };
        if matches!(failure, ProxyError::Exited(_)) && ran >= self.opts.healthy_after {
            tracing::info!(
                epoch,
                ?ran,
                "the proxy had run healthily: earlier failures no longer count"
            );
            self.failures.clear();
        }
        if self.restart_at.is_some() {
            tracing::debug!(epoch, "restart already scheduled");
            return Ok(());
        }
        let retry = self.opts.retry;
        let Some(delay) = self.failures.record(Instant::now(), &retry) else {
            tracing::error!(failures = self.failures.len(), window = ?retry.window, "proxy crash loop: giving up");
            if let Some(desired) = &self.desired {
                self.proxy.panic(desired);
            }
            return Err(AgentError::BudgetExhausted {
                retries: u32::try_from(self.failures.len()).unwrap_or(u32::MAX),
                window: retry.window,
                last: failure,
            });
        };
        tracing::info!(epoch, ?delay, failures = self.failures.len(), "proxy restart scheduled");
        self.restart_at = Some(Instant::now() + delay);
        Ok(())
    }

    /// Aborts every epoch and waits for each task, cleaning up after each.
    async fn stop_all(&mut self) {
        self.abort_all(false);
        self.restart_at = None;
        while let Some(joined) = self.tasks.join_next().await {
            if let Ok((epoch, _, _)) = joined {
                self.epochs.remove(&epoch);
                self.proxy.cleanup(epoch);
            }
        }
        self.epochs.clear();
        self.publish(false);
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
