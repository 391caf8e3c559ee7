// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The daemon: listens on the frontend socket and serves one frontend at a
//! time, each with fresh device state (sessions, rings, memory).
//!
//! Per connection, `vhost-user-backend` serves the vhost-user protocol on a
//! private socket whose other end is held by the frontend compatibility
//! layer ([`crate::proxy`]), which talks to the real frontend.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use log::{debug, error, info, warn};
use vhost::vhost_user::Listener;
use vhost_user_backend::{VhostUserDaemon, VringEpollHandler};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;

use crate::backend::CryptoBackend;
use crate::crypto::RequestLimits;
use crate::eventfd::{probe_eventfd_check, EventFdCopies};
use crate::kick_poll::KickPolls;
pub use crate::listen::Listen;
use crate::listen::{FdError, Inherited};
use crate::memory_check::helper::use_memory_check_helper;
use crate::proxy::{self, AbiChoice, Closer, KickWatch, ProxyConfig};
use crate::seccomp::WorkerFilter;
use crate::sessions::{session_set_with_ids, SessionIds};
use crate::throttle::Throttle;

/// Daemon configuration (from the command line).
#[derive(Debug, Clone)]
pub struct Config {
    /// Where frontends connect: a socket path, or an inherited socket.
    pub listen: Listen,
    /// Number of data queues.
    pub queues: usize,
    /// Most live sessions per connection.
    pub max_sessions: usize,
    /// Per-request limits.
    pub limits: RequestLimits,
    /// CREATE payload layout.
    pub session_abi: AbiChoice,
    /// How long a queue worker keeps polling after its last request.
    pub poll: std::time::Duration,
    /// Whether queue workers run under the seccomp allow-list ([`crate::seccomp`]).
    pub seccomp: bool,
    /// Whether guest memory that cannot be sealed against shrinking is
    /// refused ([`crate::proxy::ProxyConfig`]).
    pub require_sealed_memory: bool,
    /// Stats socket path ([`crate::stats::server`]), if any.
    pub stats_socket: Option<PathBuf>,
    /// The rate limits' throttle, one for the whole process (its
    /// per-queue throttled time runs across connections); `None`: no
    /// limit ([`crate::throttle`]).
    pub throttle: Option<Arc<Throttle>>,
}

/// Host-side failures (guest errors never get here).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `--stats-socket` names the frontend socket's path.
    #[error("--stats-socket {0} is the --socket-path too: give each its own path")]
    SameSocket(PathBuf),
    /// Another process is listening on the socket.
    #[error("socket {0} is in use by another process")]
    SocketInUse(PathBuf),
    /// The path exists and is not a socket.
    #[error("{0} exists and is not a socket")]
    NotASocket(PathBuf),
    /// Binding or accepting failed.
    #[error("socket {0}: {1}")]
    Socket(PathBuf, io::Error),
    /// Setting up the per-connection backend failed.
    #[error("cannot set up the backend: {0}")]
    Backend(String),
    /// The seccomp filter cannot be built or installed here.
    #[error("seccomp: {0} (--seccomp off runs without it)")]
    Seccomp(#[from] crate::seccomp::Error),
    /// The frontend's eventfds cannot be checked here (no /proc).
    #[error("cannot check the frontend's eventfds: {0}")]
    EventFdCheck(io::Error),
    /// The descriptor given with `--fd` cannot be served.
    #[error(transparent)]
    Fd(#[from] FdError),
    /// Accepting on the socket inherited with `--fd` failed.
    #[error("{0}: {1}")]
    Accept(Listen, io::Error),
    /// SIGTERM and SIGINT cannot be handled.
    #[error("cannot handle SIGTERM and SIGINT: {0}")]
    Signals(io::Error),
}

/// Binds the frontend socket, replacing a stale socket file and refusing
/// one another process still listens on.
///
/// # Errors
/// [`Error::SocketInUse`], [`Error::NotASocket`], [`Error::Socket`].
pub fn bind_listener(path: &Path) -> Result<UnixListener, Error> {
    bind_listener_with_mode(path, None)
}

/// [`bind_listener`], with the socket file given `mode` (permission bits)
/// before it appears at `path` (`None`: as the umask leaves it).
///
/// # Errors
/// As [`bind_listener`].
pub fn bind_listener_with_mode(path: &Path, mode: Option<u32>) -> Result<UnixListener, Error> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_socket() => return Err(Error::NotASocket(path.into())),
        Ok(_) => {
            if UnixStream::connect(path).is_ok() {
                return Err(Error::SocketInUse(path.into()));
            }
            std::fs::remove_file(path).map_err(|e| Error::Socket(path.into(), e))?;
        }
        Err(_) => {}
    }
    // Bind (and listen) under a temporary name, then rename: the socket
    // file appears only once it accepts connections, so a frontend started
    // as soon as it exists (QEMU, a test) never meets ECONNREFUSED.
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    // With a mode, the socket is made with it (through the umask), so no
    // other user can connect between bind and chmod.
    // SAFETY: umask(2) only sets the process's file mode mask.
    let old_umask = mode.map(|m| unsafe { libc::umask(!m & 0o777) });
    let bound = UnixListener::bind(&tmp);
    if let Some(old) = old_umask {
        // SAFETY: as above, restoring the mask.
        unsafe { libc::umask(old) };
    }
    let listener = bound.map_err(|e| Error::Socket(path.into(), e))?;
    if let Some(mode) = mode {
        use std::os::unix::fs::PermissionsExt;
        if let Err(e) = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode)) {
            let _ = std::fs::remove_file(&tmp);
            return Err(Error::Socket(path.into(), e));
        }
    }
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::Socket(path.into(), e));
    }
    Ok(listener)
}

/// Accepts one frontend and serves it until it disconnects; with `filter`,
/// its queue workers run under it.
///
/// # Errors
/// Host-side failures setting up the connection.
pub fn serve_one(
    listener: &UnixListener,
    config: &Config,
    filter: Option<&WorkerFilter>,
) -> Result<(), Error> {
    let (frontend, _) = listener.accept().map_err(|e| match &config.listen {
        Listen::Path(p) => Error::Socket(p.clone(), e),
        fd => Error::Accept(fd.clone(), e),
    })?;
    info!("frontend connected");
    serve_stream(frontend, config, filter)
}

/// The daemon's session ids, shared by all its connections, so that no id
/// is given twice in the process (see [`SessionIds`]).
fn session_ids() -> SessionIds {
    static IDS: std::sync::OnceLock<SessionIds> = std::sync::OnceLock::new();
    IDS.get_or_init(|| Arc::new(std::sync::atomic::AtomicU64::new(1)))
        .clone()
}

/// Serves one already-connected frontend until it disconnects; with
/// `filter`, its queue workers run under it.
///
/// # Errors
/// Host-side failures setting up the connection.
pub fn serve_stream(
    frontend: UnixStream,
    config: &Config,
    filter: Option<&WorkerFilter>,
) -> Result<(), Error> {
    let be = |e: &dyn std::fmt::Display| Error::Backend(e.to_string());
    let _connected = crate::stats::daemon().frontend_connected();
    let (registry, tables) = session_set_with_ids(config.max_sessions, config.queues, session_ids());
    let backend = CryptoBackend::new(tables, config.limits, config.poll).map_err(|e| be(&e))?;
    let backend = backend.with_throttle(config.throttle.clone());
    let backend = Arc::new(match filter {
        Some(f) => backend.with_seccomp(f.clone()),
        None => backend,
    });
    let mut daemon = VhostUserDaemon::new(
        "vhost-user-crypto".into(),
        backend.clone(),
        GuestMemoryAtomic::new(GuestMemoryMmap::default()),
    )
    .map_err(|e| be(&e))?;
    // Each worker thread (one per queue) also listens on the backend's
    // wake eventfd of its queue (`CryptoBackend::wake_listener`), and on
    // the frontend's kick eventfd of its ring (`KickWatcher`).
    let handlers = daemon.get_epoll_handlers();
    for (queue, handler) in handlers.iter().enumerate() {
        if let Some((fd, id)) = backend.wake_listener(queue) {
            handler
                .register_listener(fd, EventSet::IN, id)
                .map_err(|e| be(&e))?;
        }
    }
    let mut kicks = KickWatcher {
        handlers,
        backend: backend.clone(),
        polls: KickPolls::default(),
    };

    // The library accepts its end on a private socket in a 0700 directory;
    // we connect first, so the connection it accepts is ours.
    let dir = tempfile::Builder::new()
        .prefix("vhost-user-crypto.")
        .tempdir()
        .map_err(|e| be(&e))?;
    let inner_path = dir.path().join("backend.sock");
    let inner = UnixListener::bind(&inner_path).map_err(|e| be(&e))?;
    let ours = UnixStream::connect(&inner_path).map_err(|e| be(&e))?;
    let mut listener = Listener::from(inner);
    daemon.start(&mut listener).map_err(|e| be(&e))?;
    drop(listener);
    drop(dir);

    let proxy = ProxyConfig {
        abi: config.session_abi,
        num_queues: config.queues,
        require_sealed_memory: config.require_sealed_memory,
    };
    let mut copies = EventFdCopies::default();
    let closer = Closer::start().map_err(|e| be(&e))?;
    match proxy::run(
        frontend,
        ours,
        registry,
        proxy,
        &mut copies,
        Some(&mut kicks),
        backend.disconnect_flag(),
        &closer,
    ) {
        Ok(()) => debug!("frontend connection closed cleanly"),
        Err(e) => warn!("frontend connection ended: {e}"),
    }
    drop(closer);
    drop(kicks);
    // The queue workers stop serving now, even if the guest keeps its
    // rings busy (else they would never go back to the library's event
    // loop, and dropping the daemon below would wait for them forever).
    backend.disconnect();
    // The library's threads are joined on a thread of their own, so that
    // this one can wake a worker blocked on an eventfd and give up after
    // a while (see `await_teardown`).
    let (done, finished) = mpsc::channel();
    let reaper = thread::Builder::new()
        .name("vuc-teardown".into())
        .spawn(move || {
            if let Err(e) = daemon.wait() {
                debug!("vhost-user handler ended: {e}");
            }
            // Dropping the daemon joins the queue worker threads.
            drop(daemon);
            let _ = done.send(());
        })
        .map_err(|e| be(&e))?;
    await_teardown(&finished, copies, teardown_cap(config));
    let reaped = reaper.join().is_ok();
    info!("completed requests per queue: {:?}", backend.completed());
    let failed = backend.signal_failures();
    if failed > 0 {
        warn!("{failed} used-buffer notifications could not be signalled on this connection");
    }
    if reaped {
        // SAFETY: the reaper ended normally, after dropping the daemon, so
        // the library's worker threads are joined.
        unsafe { backend.close_handed_out_fds() };
    } else {
        // (A panic there may have left workers watching the descriptors:
        // they stay open, a leak rather than a reused descriptor.)
        error!("tearing the connection down panicked; its exit-event descriptors are left open");
    }
    // Dropping the backend (last reference) drops the session tables,
    // zeroizing keys.
    Ok(())
}

/// The frontend's kick eventfds of one connection's data rings, each
/// watched by its queue's worker thread (in that thread's epoll, under
/// [`CryptoBackend::kick_event_id`]; the worker reads it, see
/// `CryptoBackend::handle_event`) instead of by vhost-user-backend, whose
/// worker thread ends on a failed kick read (`proxy`'s module
/// documentation).
struct KickWatcher {
    /// The library's epoll handlers, one per worker thread (= queue).
    handlers: Vec<Arc<VringEpollHandler<Arc<CryptoBackend>>>>,
    backend: Arc<CryptoBackend>,
    /// Timers of the rings polled for want of a kick eventfd.
    polls: KickPolls,
}

impl KickWatch for KickWatcher {
    fn set_kick(&mut self, index: usize, kick: Option<&File>) -> io::Result<()> {
        let Some(handler) = self.handlers.get(index) else {
            return Ok(());
        };
        let id = self.backend.kick_event_id();
        // No kick eventfd (VRING_NOFD_MASK): a polling timer in its place
        // (`crate::kick_poll`).
        let was_polled = self.polls.stop(index);
        let new = match kick {
            Some(k) => Some(Arc::new(k.try_clone()?)),
            None => Some(self.polls.start(index)?),
        };
        if let Some(k) = &new {
            handler.register_listener(k.as_raw_fd(), EventSet::IN, id)?;
        }
        // The old one leaves the epoll while this copy still holds it open
        // (the epoll would keep watching it if another copy, ours or the
        // frontend's, stayed open, and a write to it would still wake the
        // worker).
        if let Some(old) = self.backend.replace_kick(index, new) {
            if let Err(e) = handler.unregister_listener(old.as_raw_fd(), EventSet::IN, id) {
                debug!("ring {index}: the replaced kick eventfd was not in the epoll: {e}");
            }
        }
        if was_polled {
            // A request the guest made available after the timer's last
            // tick has no kick coming: one look at the ring.
            self.backend.wake(index);
        }
        Ok(())
    }
}

/// The pause before the daemon accepts again after a failed connection
/// (a failed accept or connection set-up).
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// How long a connection's teardown may take before the daemon starts
/// waking workers blocked on the frontend's eventfds.
const TEARDOWN_GRACE: Duration = Duration::from_millis(100);
/// How long a connection's teardown may go on with no queue worker using
/// any CPU before the daemon gives up and exits ([`TEARDOWN_STUCK_EXIT`]).
pub const TEARDOWN_LIMIT: Duration = Duration::from_secs(10);
/// Exit status of the daemon when a connection could not be torn down
/// (see [`TEARDOWN_LIMIT`]).
pub const TEARDOWN_STUCK_EXIT: i32 = 3;

/// The longest a connection's teardown may take in all: [`TEARDOWN_LIMIT`]
/// plus the worst batch each worker may still be finishing (a group of
/// `algorithms::MAX_LANES` AlgChain requests and the request that crosses
/// the byte cap, each counting its cipher and its MAC: up to twice
/// `--max-request-bytes`) at a pessimistic 50 MB/s (single-stream
/// HMAC-SHA1 runs at about 1.3 GB/s here). A frontend gone for good could otherwise keep a second worker
/// busy with kicks on an eventfd it still holds, and reset the
/// no-CPU clock for ever.
fn teardown_cap(config: &Config) -> Duration {
    let batch = (2 * algorithms::MAX_LANES + 2) as f64 * f64::from(config.limits.max_request_bytes);
    TEARDOWN_LIMIT + Duration::from_secs_f64(config.queues as f64 * batch / 50e6)
}

/// CPU time, in clock ticks, that this process's queue worker threads
/// (vhost-user-backend names them `vring_worker`) have used: fields 14
/// and 15 (utime, stime) of `/proc/self/task/TID/stat` (proc(5)).
fn worker_cpu_ticks() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "vring_worker"))
        .filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok())
        .filter_map(|stat| {
            // After "(comm) ", field 3 (state) is the first: utime and
            // stime are the 12th and 13th.
            let rest = &stat[stat.rfind(')')? + 2..];
            let mut f = rest.split_whitespace().skip(11);
            Some(f.next()?.parse::<u64>().ok()? + f.next()?.parse::<u64>().ok()?)
        })
        .sum()
}

/// Waits until `finished` says the connection's threads are joined, and
/// until no more than [`proxy::MAX_PENDING_CLOSES`] frontend
/// descriptors wait to be closed ([`proxy::pending_closes`];
/// fewer are left to their closer threads). After
/// [`TEARDOWN_GRACE`] a thread of its own calls
/// [`EventFdCopies::wake_workers`] every 20 ms, for a worker blocked on an
/// eventfd whose `O_NONBLOCK` the frontend cleared. Once the workers have
/// used no CPU for [`TEARDOWN_LIMIT`] (busy ones are finishing a batch,
/// which may be long with large requests; idle ones would have ended), or
/// after `cap` in all, the process exits with [`TEARDOWN_STUCK_EXIT`]
/// (logged): waiting on would leave the daemon serving nobody, while an
/// exit lets a supervisor start it again.
fn await_teardown(finished: &mpsc::Receiver<()>, copies: EventFdCopies, cap: Duration) {
    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let mut copies = Some(copies);
    let (mut ticks, mut last_progress, mut last_look) = (worker_cpu_ticks(), start, start);
    let mut joined = false;
    let mut last_pending = proxy::pending_closes();
    loop {
        if !joined {
            match finished.recv_timeout(Duration::from_millis(20)) {
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                _ => joined = true,
            }
        } else if proxy::pending_closes() > proxy::MAX_PENDING_CLOSES {
            thread::sleep(Duration::from_millis(20));
        } else {
            break;
        }
        if last_look.elapsed() >= Duration::from_secs(1) {
            last_look = Instant::now();
            let now = worker_cpu_ticks();
            if now != ticks {
                (ticks, last_progress) = (now, last_look);
            }
            // Descriptors being closed count as progress too.
            let pending = proxy::pending_closes();
            if pending < last_pending {
                last_progress = last_look;
            }
            last_pending = pending;
        }
        if last_progress.elapsed() >= TEARDOWN_LIMIT || start.elapsed() >= cap {
            error!(
                "the connection is not torn down after {:?} (its queue workers used no CPU for {:?}): \
                 one stays blocked on an eventfd the frontend controls, or closing one of the \
                 frontend's descriptors blocks; exiting (status {TEARDOWN_STUCK_EXIT})",
                start.elapsed(),
                last_progress.elapsed()
            );
            std::process::exit(TEARDOWN_STUCK_EXIT);
        }
        if start.elapsed() >= TEARDOWN_GRACE {
            if let Some(copies) = copies.take() {
                warn!("tearing the connection down takes more than {TEARDOWN_GRACE:?}: waking any queue worker blocked on an eventfd");
                let stop = stop.clone();
                // Not joined: a frontend that races the kick write could
                // keep it blocked (see `wake_workers`).
                let spawned = thread::Builder::new().name("vuc-wake".into()).spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        copies.wake_workers();
                        thread::sleep(Duration::from_millis(20));
                    }
                });
                if let Err(e) = spawned {
                    warn!("cannot start the thread that wakes blocked workers: {e}");
                }
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
}

/// Raises the soft limit on open descriptors (`RLIMIT_NOFILE`) to the hard
/// one, as far as it goes: the daemon holds a frontend's memory files and
/// eventfds, and up to `proxy::MAX_PENDING_CLOSES` of its
/// descriptors whose close the frontend made block; a full table would
/// refuse the next frontend's (and make the kernel close descriptors it
/// cannot install on the receiving thread). Best effort: a failure is
/// logged, not fatal.
fn raise_descriptor_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) writing into a struct of ours.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } < 0 || lim.rlim_cur >= lim.rlim_max {
        return;
    }
    let old = lim.rlim_cur;
    lim.rlim_cur = lim.rlim_max;
    // SAFETY: setrlimit(2) reading a struct of ours.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } < 0 {
        warn!(
            "cannot raise the open-descriptor limit from {old}: {}",
            io::Error::last_os_error()
        );
    } else {
        debug!("open-descriptor limit raised from {old} to {}", lim.rlim_cur);
    }
}

/// Installs the daemon's logger (env_logger): the level from `RUST_LOG`
/// (default `info`); colour from `RUST_LOG_STYLE` (`always`, `never`),
/// else off when `NO_COLOR` is set or `CLICOLOR` is `0`, on when
/// `CLICOLOR_FORCE` is set (not `0`), else on when stderr is a terminal
/// and `TERM` is not `dumb`, decided here, once (the conventions anstream
/// follows, which env_logger used before).
///
/// Queue workers log from threads under the seccomp filter
/// ([`crate::seccomp`]), which does not allow `ioctl`. env_logger's
/// stderr target, when it colours, asks for every line whether stderr is a
/// terminal (anstream `AutoStream::always_ansi`: `isatty`, an `ioctl`),
/// and the filter kills the process: a guest could kill the daemon with a
/// request that a worker logs (an avail-index jump, H10). So records are
/// styled into a buffer and written to stderr as bytes
/// (`Target::Pipe`), which makes no system call but `write`.
pub fn init_logging() {
    use std::io::IsTerminal;
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    let colour = match std::env::var("RUST_LOG_STYLE").as_deref() {
        Ok("always") => true,
        Ok("never") => false,
        _ if var("NO_COLOR").is_some() => false,
        _ if var("CLICOLOR").is_some_and(|v| v == "0") => false,
        _ if var("CLICOLOR_FORCE").is_some_and(|v| v != "0") => true,
        _ => std::io::stderr().is_terminal() && var("TERM").is_some_and(|t| t != "dumb"),
    };
    env_logger::Builder::from_env(env_logger::Env::default().filter_or("RUST_LOG", "info"))
        .write_style(if colour {
            env_logger::WriteStyle::Always
        } else {
            env_logger::WriteStyle::Never
        })
        .target(env_logger::Target::Pipe(Box::new(std::io::stderr())))
        .init();
}

/// Makes the process-wide engine choices now, before any queue worker
/// runs, and logs them (`algorithms::AES_ENGINE_ENV`,
/// `algorithms::SHA_ENGINE_ENV`).
fn log_engines() {
    let aes = algorithms::aes_engine_choice();
    let runs = algorithms::AesEngine::available().into_iter().map(|e| e.name());
    warn_if_ignored(algorithms::AES_ENGINE_ENV, "AES", aes, aes.engine.name(), runs);
    info!("multi-buffer AES-CBC engine: {}", aes.engine.name());
    let sha = algorithms::sha_engine_choice();
    let runs = algorithms::ShaEngine::available().map(|e| e.name());
    warn_if_ignored(algorithms::SHA_ENGINE_ENV, "SHA", sha, sha.engine.name(), runs);
    info!("HMAC engine: {}", sha.engine.name());
}

/// Warns when the engine variable `var` named no `kind` engine this CPU
/// runs (`runs` lists those it does), so `using` was taken instead.
fn warn_if_ignored<E>(
    var: &str,
    kind: &str,
    choice: &algorithms::EngineChoice<E>,
    using: &str,
    runs: impl Iterator<Item = &'static str>,
) {
    if choice.ignored {
        warn!(
            "{var}={:?} names no {kind} engine this CPU runs (it runs: {}); using {using}",
            choice.requested.as_deref().unwrap_or_default(),
            runs.collect::<Vec<_>>().join(", "),
        );
    }
}

/// Where [`run`] serves: a descriptor taken over at its start, or a
/// path it binds later, after the stats socket (if any), so that a
/// stats socket that fails leaves no socket file behind.
enum ListenOn<'a> {
    Inherited(Inherited),
    Bind(&'a Path),
}

/// Runs the daemon: take SIGTERM and SIGINT ([`crate::signals`]), check
/// the seccomp filter (unless off), bind or check the socket, then serve
/// frontends one after another for ever; on a connected socket inherited
/// with `--fd`, serve that one frontend and return.
///
/// # Errors
/// The signals cannot be handled, the frontend's eventfds cannot be
/// checked here (no `/proc`), the seccomp filter does not work here,
/// binding the socket failed, or the `--fd` descriptor is not a Unix
/// stream socket.
pub fn run(config: &Config) -> Result<(), Error> {
    // First, before any thread starts: every thread inherits the mask.
    crate::signals::handle_exit_signals().map_err(Error::Signals)?;
    // The inherited descriptor is taken before the daemon opens any of
    // its own, one of which could otherwise take that number when the
    // caller passed nothing there.
    let listen = match &config.listen {
        Listen::Fd(fd) => ListenOn::Inherited(crate::listen::inherit(*fd)?),
        Listen::Path(path) => ListenOn::Bind(path),
    };
    // (Where `uptime_s` counts from.)
    let _ = crate::stats::daemon();
    probe_eventfd_check().map_err(Error::EventFdCheck)?;
    raise_descriptor_limit();
    // (This binary, also when its file was replaced or removed since.)
    use_memory_check_helper("/proc/self/exe".into());
    let filter = if config.seccomp {
        let f = WorkerFilter::new()?;
        f.probe()?;
        Some(f)
    } else {
        None
    };
    // Before the frontend socket, whose file tells a frontend that the
    // daemon is ready; the stats socket file is removed when `run`
    // returns, or at SIGTERM and SIGINT ([`crate::signals`]).
    let stats = match &config.stats_socket {
        Some(p) if matches!(&config.listen, Listen::Path(l) if l == p) => {
            return Err(Error::SameSocket(p.clone()));
        }
        Some(p) => {
            let l = bind_listener_with_mode(p, Some(crate::stats::server::STATS_SOCKET_MODE))?;
            let server =
                crate::stats::server::start(l, p, config.queues).map_err(|e| Error::Socket(p.clone(), e))?;
            if let Err(e) = crate::signals::remove_on_exit(p) {
                warn!("{} will not be removed at exit: {e}", p.display());
            }
            Some(server)
        }
        None => None,
    };
    let listener = match listen {
        ListenOn::Inherited(inherited) => inherited,
        ListenOn::Bind(path) => {
            let l = bind_listener(path)?;
            if let Err(e) = crate::signals::remove_on_exit(path) {
                warn!("{} will not be removed at exit: {e}", path.display());
            }
            Inherited::Listener(l)
        }
    };
    // Logged once the socket is bound, so that a socket problem is the
    // only line printed.
    if filter.is_some() {
        info!("queue workers run under the seccomp allow-list");
    } else {
        warn!("--seccomp off: queue workers run without a syscall filter");
    }
    log_engines();
    let listener = match listener {
        Inherited::Listener(l) => l,
        Inherited::Connected(frontend) => {
            info!("serving the frontend connected on {}", config.listen);
            let served = serve_stream(frontend, config, filter.as_ref());
            crate::signals::remove_files();
            served?;
            info!("the frontend on {} left; exiting", config.listen);
            return Ok(());
        }
    };
    info!("listening on {}", config.listen);
    if let Some(s) = &stats {
        info!("statistics on {}", s.path().display());
    }
    loop {
        if let Err(e) = serve_one(&listener, config, filter.as_ref()) {
            error!("{e}");
            // (A listening socket that keeps failing, such as an
            // inherited one its other holder shut down, is not retried
            // in a busy loop.)
            thread::sleep(ACCEPT_RETRY);
        }
    }
}
