// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Crypto sessions: the per-connection registry that answers the frontend's
//! session messages, and the per-queue tables the data path looks sessions
//! up in.
//!
//! Sessions belong to a connection (QEMU routes every session message of a
//! device through one socket, `docs/PROTOCOL.md` §2.4). The registry lives
//! with the session-message handler; it validates a CREATE, expands the key
//! once, and posts the session to every queue's table before the reply
//! goes out. A queue worker locks its table once per batch (not per
//! request), and whoever locks a table first applies what was posted to it
//! (two atomic loads otherwise), so a session is in the table before any
//! batch can look its id up. The registry applies the posts itself to every
//! table whose lock is free and leaves the others to their workers, whose
//! current batch is then running: a CREATE waits for no batch, and a CLOSE
//! waits for the current batch of the busy queues, all at once rather than
//! one queue after another (with more busy queues than CPUs, one after
//! another took seconds). What waits to be applied is bounded: a CREATE
//! adds one entry per table, and only up to `max_sessions` live sessions;
//! a CLOSE returns only once every table has applied everything before it.
//! Each table has room for twice `max_sessions` (up to a bound), so that
//! the tombstones removals leave make it rehash in place rather than grow:
//! up to that bound, applying a post never allocates, in a worker either.
//!
//! Ids start at 1 and are never reused: not on a connection, and in the
//! daemon not across connections either ([`SessionIds`]). Key schedules are
//! zeroized when a session is closed (it is dropped from every table at
//! once) and when the connection ends (the tables are dropped), see
//! `algorithms::AesCbcKey`. Copies that moves and the cipher libraries
//! leave on a thread's stack (spilled round keys, HMAC states, the padded
//! HMAC key block) are cleared with [`wipe_stack`]: by the session-message
//! handler after each CREATE, and by each queue worker after the first
//! batch that follows a CLOSE and whenever it goes back to waiting for
//! kicks (`QueueWorker::process`, `backend.rs`). On SIGTERM and SIGINT
//! the tables of every live connection are emptied before the process
//! exits ([`LiveTables::wipe_all`], `signals.rs`).

mod live;

pub use live::{live_tables, LiveTables, Wiped};

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::Duration;

use algorithms::{AesCbcKey, Direction, MacAlg, MacKey};
use log::{debug, warn};

use crate::wire::session::SymSessionInfo;
use crate::wire::session::MAX_AUTH_KEY_LEN;
use crate::wire::virtio_crypto::{
    Status, VIRTIO_CRYPTO_CIPHER_AES_CBC, VIRTIO_CRYPTO_CIPHER_CREATE_SESSION, VIRTIO_CRYPTO_MAC_HMAC_SHA1,
    VIRTIO_CRYPTO_MAC_HMAC_SHA_256, VIRTIO_CRYPTO_OP_DECRYPT, VIRTIO_CRYPTO_OP_ENCRYPT,
    VIRTIO_CRYPTO_SYM_ALG_CHAIN_ORDER_CIPHER_THEN_HASH, VIRTIO_CRYPTO_SYM_ALG_CHAIN_ORDER_HASH_THEN_CIPHER,
    VIRTIO_CRYPTO_SYM_HASH_MODE_AUTH, VIRTIO_CRYPTO_SYM_OP_ALGORITHM_CHAINING, VIRTIO_CRYPTO_SYM_OP_CIPHER,
};

/// Most sessions a table reserves room for, twice over, up front. With a
/// larger `max_sessions` more still work: a table may then grow when a
/// CREATE is applied to it, by the registry or at the start of a queue's
/// batch (never for a data request).
const MAX_PRERESERVED: usize = 4096;

/// Bytes of stack a queue worker wipes ([`wipe_stack`]): more than twice
/// what a batch of multi-buffer AES, block-by-block and HMAC requests uses
/// below `process`, in release and in debug builds (the `security`
/// suite's `key_residue` tests check that nothing is left).
pub const WORKER_STACK_WIPE_BYTES: usize = 32 * 1024;

/// Bytes of stack the session-message handler wipes after a CREATE: key
/// expansion and the HMAC key set-up go deeper than 32 KiB in a debug
/// build. A CREATE is rare, so the margin is wide.
pub const CREATE_STACK_WIPE_BYTES: usize = 128 * 1024;

/// Zeroes `BYTES` of the calling thread's stack just below the caller's
/// frame: where the functions it called before kept their locals and
/// spills, including copies of key material that no value owns any more
/// (moved-from sessions, round keys the `aes` crate spilled or copied, the
/// HMAC states and padded key block `algorithms::MacKey::new` made). Only what ran in frames the
/// caller called is covered, so the key-handling code must not be inlined
/// into the caller (`#[inline(never)]` on it). `zeroize::zeroize_stack`: a
/// memset behind an optimisation barrier; the `security` suite's `key_residue` tests check
/// that nothing is left, in release and debug builds.
#[inline]
pub fn wipe_stack<const BYTES: usize>() {
    zeroize::zeroize_stack::<BYTES>();
}

/// One session as the data path sees it: a cipher session, or an
/// algorithm-chaining session (cipher plus HMAC).
#[derive(Debug, Clone)]
pub struct Session {
    /// The direction the session was created for.
    pub direction: Direction,
    /// The expanded key schedule.
    pub key: AesCbcKey,
    /// For an ALGORITHM_CHAINING session, the HMAC key and tag length. The
    /// order follows from `direction`: encrypt sessions are
    /// CIPHER_THEN_HASH (MAC generated over the output), decrypt sessions
    /// HASH_THEN_CIPHER (MAC verified over the input), the two
    /// combinations drivers use and DPDK's vhost-crypto implements
    /// (`lib/vhost/vhost_crypto.c`, `docs/PROTOCOL.md` §9).
    pub mac: Option<MacKey>,
}

/// Where session ids come from: the next id to give, shared by the
/// registries that draw from it ([`session_set_with_ids`]). The daemon
/// keeps one for the whole process, so that ids are never reused, across
/// connections either. After a frontend reconnects (QEMU's `reconnect`
/// chardev option) the guest driver still holds the ids the previous
/// connection gave it (it puts the CREATE reply's value in every request,
/// `docs/PROTOCOL.md` §2.2) and may send requests naming them; with ids
/// starting again at 1 per connection, such a request would run under
/// whichever new session got the same id, that is under another
/// session's key. Here it gets INVSESS. (DPDK's vhost-crypto counts from 1
/// per device, `docs/PROTOCOL.md` §9.)
pub type SessionIds = Arc<AtomicU64>;

/// Per-connection session registry (the session-message side).
#[derive(Debug)]
pub struct SessionRegistry {
    ids: SessionIds,
    live: HashSet<u64>,
    max_sessions: usize,
    tables: Vec<SessionTable>,
    refused_full: u64,
}

impl SessionRegistry {
    /// A registry allowing `max_sessions` live sessions, updating `tables`,
    /// giving ids from `ids`.
    pub fn new(max_sessions: usize, tables: Vec<SessionTable>, ids: SessionIds) -> Self {
        SessionRegistry {
            ids,
            live: HashSet::with_capacity(max_sessions.min(MAX_PRERESERVED)),
            max_sessions,
            tables,
            refused_full: 0,
        }
    }

    /// Number of live sessions.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// Whether no session is live.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// Handles a CREATE: returns the new session id (≥ 1, never given
    /// before by this registry's [`SessionIds`]), or a negative
    /// virtio-crypto status (−NOTSUPP for an unsupported opcode, op_type,
    /// algorithm, hash mode, chaining order or AAD, −ERR for a bad key
    /// length, digest length or direction, −NOSPC when `max_sessions` are
    /// live). QEMU turns any negative value into `VIRTIO_CRYPTO_ERR` for
    /// the guest (`cryptodev-vhost-user.c`).
    ///
    /// Cipher sessions (`op_type` CIPHER): AES-CBC with a 16, 24 or 32-byte
    /// key. Chaining sessions (`op_type` ALGORITHM_CHAINING, spec §5.9.7.2.1):
    /// the same cipher plus `hash_mode` AUTH with HMAC_SHA1 or HMAC_SHA_256,
    /// an auth key of 0 to 512 bytes, a digest of 1 up to the hash size,
    /// `aad_len` 0, and either encrypt + CIPHER_THEN_HASH or decrypt +
    /// HASH_THEN_CIPHER.
    ///
    /// Counted in the daemon's statistics ([`crate::stats`]).
    pub fn create(&mut self, info: &SymSessionInfo) -> i64 {
        let id = self.create_session(info);
        let stats = &crate::stats::daemon().sessions;
        if id > 0 {
            stats.created();
        } else {
            stats.create_failed();
        }
        id
    }

    /// [`SessionRegistry::create`] without the counting.
    fn create_session(&mut self, info: &SymSessionInfo) -> i64 {
        let neg = |s: Status| -(s as i64);
        let op_type = u32::from(info.op_type);
        if info.op_code != VIRTIO_CRYPTO_CIPHER_CREATE_SESSION
            || (op_type != VIRTIO_CRYPTO_SYM_OP_CIPHER && op_type != VIRTIO_CRYPTO_SYM_OP_ALGORITHM_CHAINING)
            || info.cipher_alg != VIRTIO_CRYPTO_CIPHER_AES_CBC
        {
            debug!(
                "CREATE_CRYPTO_SESSION refused: op_code {:#x} op_type {} cipher_alg {}",
                info.op_code, info.op_type, info.cipher_alg
            );
            return neg(Status::NotSupp);
        }
        let direction = match info.direction {
            VIRTIO_CRYPTO_OP_ENCRYPT => Direction::Encrypt,
            VIRTIO_CRYPTO_OP_DECRYPT => Direction::Decrypt,
            d => {
                debug!("CREATE_CRYPTO_SESSION refused: direction {d}");
                return neg(Status::Err);
            }
        };
        let mac = if op_type == VIRTIO_CRYPTO_SYM_OP_ALGORITHM_CHAINING {
            match alg_chain_mac(info, direction) {
                Ok(m) => Some(m),
                Err(s) => return neg(s),
            }
        } else {
            None
        };
        let Some(key) = info.cipher_key().and_then(|k| AesCbcKey::new(k).ok()) else {
            debug!("CREATE_CRYPTO_SESSION refused: key_len {}", info.key_len);
            return neg(Status::Err);
        };
        if self.live.len() >= self.max_sessions {
            // A guest can repeat this at will: warn once per connection.
            if self.refused_full == 0 {
                warn!(
                    "CREATE_CRYPTO_SESSION refused: {} sessions live (--max-sessions)",
                    self.live.len()
                );
            }
            self.refused_full += 1;
            return neg(Status::NoSpc);
        }
        // (At one CREATE per microsecond the ids would last 292,000 years
        // before reaching i64::MAX, where the reply would turn negative.)
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        self.live.insert(id);
        let session = Session { direction, key, mac };
        for t in &self.tables {
            // Applied here if the queue is between batches, else by its
            // worker when it locks the table for its next batch, before
            // that batch looks anything up: a request naming the id can
            // only come after the reply.
            t.post(Update::Insert(id, SessionBox::new(session.clone())));
            t.try_apply();
        }
        debug!(
            "session {id} created ({direction:?}, {} bits, mac {:?})",
            session.key.key_bits(),
            session.mac.as_ref().map(|m| (m.alg(), m.digest_len()))
        );
        id as i64
    }

    /// Handles a CLOSE. Unknown ids are ignored; returns whether `id` was live.
    pub fn close(&mut self, id: u64) -> bool {
        if !self.live.remove(&id) {
            debug!("CLOSE_CRYPTO_SESSION for unknown session {id} ignored");
            return false;
        }
        // Dropping the session zeroizes its whole box, key schedule
        // included (the table itself only ever held the pointer), wherever
        // the removal is applied; then the queue's worker wipes its stack
        // (`TableShared::apply_posted`).
        let waits: Vec<u64> = self.tables.iter().map(|t| t.post(Update::Remove(id))).collect();
        self.await_applied(&waits);
        crate::stats::daemon().sessions.closed();
        debug!("session {id} closed");
        true
    }

    /// Returns once every table has applied the posts up to its entry in
    /// `waits` (one per table): it applies them itself to each table whose lock is free,
    /// and each busy queue's worker applies them when it locks its table
    /// for its next batch (or, if the ring has gone quiet, this does once
    /// the lock is free). So it waits for the slowest queue's current
    /// batch, not for each queue's in turn.
    fn await_applied(&self, waits: &[u64]) {
        let mut left = self.tables.len();
        while left > 0 {
            left = 0;
            for (t, &seq) in self.tables.iter().zip(waits) {
                if t.applied() < seq && !t.try_apply() {
                    left += 1;
                }
            }
            if left > 0 {
                // Batches are bounded (64 KiB of work and one request,
                // tens of microseconds to a millisecond of CPU).
                std::thread::sleep(AWAIT_APPLIED_POLL);
            }
        }
    }
}

impl Drop for SessionRegistry {
    /// The sessions still live end with the connection (counted as
    /// `dropped` in the statistics).
    fn drop(&mut self) {
        crate::stats::daemon().sessions.dropped(self.live.len() as u64);
    }
}

/// How often [`SessionRegistry::await_applied`] looks at the tables that
/// a queue's batch still has locked.
const AWAIT_APPLIED_POLL: Duration = Duration::from_micros(20);

/// Checks the chaining part of a CREATE and builds its MAC key (the raw
/// auth key bytes stay in the message's zeroizing buffer).
fn alg_chain_mac(info: &SymSessionInfo, direction: Direction) -> Result<MacKey, Status> {
    let alg = match info.hash_alg {
        VIRTIO_CRYPTO_MAC_HMAC_SHA1 => Some(MacAlg::HmacSha1),
        VIRTIO_CRYPTO_MAC_HMAC_SHA_256 => Some(MacAlg::HmacSha256),
        _ => None,
    };
    let order_ok = matches!(
        (direction, info.alg_chain_order),
        (
            Direction::Encrypt,
            VIRTIO_CRYPTO_SYM_ALG_CHAIN_ORDER_CIPHER_THEN_HASH
        ) | (
            Direction::Decrypt,
            VIRTIO_CRYPTO_SYM_ALG_CHAIN_ORDER_HASH_THEN_CIPHER
        )
    );
    let alg = match alg {
        Some(a) if info.hash_mode == VIRTIO_CRYPTO_SYM_HASH_MODE_AUTH && order_ok && info.aad_len == 0 => a,
        _ => {
            debug!(
            "CREATE_CRYPTO_SESSION refused: hash_mode {} hash_alg {} order {} direction {direction:?} aad_len {}",
            info.hash_mode, info.hash_alg, info.alg_chain_order, info.aad_len
            );
            return Err(Status::NotSupp);
        }
    };
    let auth_key_len = info.auth_key_len as usize;
    let Some(auth_key) = info
        .auth_key
        .get(..auth_key_len)
        .filter(|_| auth_key_len <= MAX_AUTH_KEY_LEN)
    else {
        debug!(
            "CREATE_CRYPTO_SESSION refused: auth_key_len {}",
            info.auth_key_len
        );
        return Err(Status::Err);
    };
    MacKey::new(alg, auth_key, info.hash_result_len as usize).map_err(|_| {
        debug!(
            "CREATE_CRYPTO_SESSION refused: hash_result_len {}",
            info.hash_result_len
        );
        Status::Err
    })
}

/// Hasher for session ids: one multiply (Fibonacci hashing). The ids are
/// the registry's own counter (1, 2, 3, …, [`SessionIds`]), never chosen by the guest, so
/// the table needs no protection against crafted collisions (a guest can
/// only look ids up); SipHash cost a tenth of the per-request time.
#[derive(Debug, Default, Clone, Copy)]
pub struct SessionIdHasher(u64);

impl Hasher for SessionIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u64(&mut self, id: u64) {
        self.0 = (self.0 ^ id).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type IdMap<V> = HashMap<u64, V, BuildHasherDefault<SessionIdHasher>>;

/// The sessions one queue can use, as the data path sees them while its
/// table is locked.
///
/// Each session is boxed (`SessionBox`, private): removing an entry from a hash
/// table moves the value out of its bucket (a bitwise copy) and growing the
/// table moves every value to a new allocation, and neither zeroizes the
/// bytes left behind. A box stays where it is and is zeroized whole when
/// the session is dropped; only the pointer is ever copied.
#[derive(Debug, Default)]
pub struct Sessions {
    map: IdMap<SessionBox>,
}

/// A session on the heap whose whole allocation is zeroized when it is
/// dropped, after the session itself. Dropping the session zeroizes the
/// key schedule in use, but the box may also hold bytes the value never
/// initialised, copied in from the stack temporary it was moved from:
/// the unused part of the `aes` crate's key-schedule union (software and
/// AES-NI schedules share it) and padding. In unoptimised builds those
/// held key-expansion temporaries (the `security_heap` suite's `key_zeroize` tests).
struct SessionBox(Box<MaybeUninit<Session>>);

impl SessionBox {
    fn new(session: Session) -> Self {
        let mut b = Box::new(MaybeUninit::<Session>::zeroed());
        b.write(session);
        SessionBox(b)
    }
}

impl std::ops::Deref for SessionBox {
    type Target = Session;

    fn deref(&self) -> &Session {
        // SAFETY: written in `new` and dropped only in `drop`.
        unsafe { self.0.assume_init_ref() }
    }
}

impl Drop for SessionBox {
    fn drop(&mut self) {
        // SAFETY: written in `new`, dropped here once; never read after.
        unsafe { self.0.assume_init_drop() };
        // SAFETY: the box's memory is ours for size_of::<Session>() bytes,
        // holds no value any more, and zeroes are a valid MaybeUninit.
        unsafe { zeroize::zeroize_flat_type(&mut *self.0 as *mut MaybeUninit<Session>) };
    }
}

impl std::fmt::Debug for SessionBox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        Session::fmt(self, f)
    }
}

impl Sessions {
    /// Looks a session up.
    pub fn get(&self, id: u64) -> Option<&Session> {
        self.map.get(&id).map(|s| &**s)
    }

    /// Number of sessions.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// A queue's session table, shared between the registry (which updates it)
/// and the queue worker (which locks it once per batch).
#[derive(Debug, Clone)]
pub struct SessionTable {
    shared: Arc<TableShared>,
}

#[derive(Debug)]
struct TableShared {
    sessions: Mutex<Sessions>,
    /// Sessions closed in this table so far.
    closes: AtomicU64,
    /// What the registry posted and nobody has applied to `sessions` yet,
    /// oldest first.
    posts: Mutex<Vec<Update>>,
    /// Posts so far (changed with `posts` locked).
    posted: AtomicU64,
    /// Posts applied to `sessions` so far (changed with both locked).
    applied: AtomicU64,
    /// The process's list of live tables this one is in; once it is
    /// wiped, posts are dropped.
    live: &'static LiveTables,
}

/// A change to one queue's table, posted by the registry and applied by
/// whoever locks the table next.
#[derive(Debug)]
enum Update {
    Insert(u64, SessionBox),
    Remove(u64),
}

impl TableShared {
    /// Applies what was posted (`sessions` being this table's, locked).
    /// Two atomic loads when nothing was.
    #[inline]
    fn apply(&self, sessions: &mut Sessions) {
        if self.posted.load(Ordering::Acquire) != self.applied.load(Ordering::Relaxed) {
            self.apply_posted(sessions);
        }
    }

    #[cold]
    #[inline(never)]
    fn apply_posted(&self, sessions: &mut Sessions) {
        let mut posts = self.posts.lock().unwrap_or_else(|e| e.into_inner());
        let n = posts.len() as u64;
        let mut closed = 0;
        for u in posts.drain(..) {
            match u {
                Update::Insert(id, b) => drop(sessions.map.insert(id, b)),
                Update::Remove(id) => {
                    drop(sessions.map.remove(&id));
                    closed += 1;
                }
            }
        }
        if closed > 0 {
            // Tells the queue's worker to wipe its stack: the batches that
            // used the session have ended (this table was locked). Before
            // `applied`, which a CLOSE waits for.
            self.closes.fetch_add(closed, Ordering::Release);
        }
        self.applied.fetch_add(n, Ordering::Release);
    }
}

impl SessionTable {
    /// An empty table with room for twice `max_sessions` (up to
    /// `MAX_PRERESERVED`, 4,096, of them), in the process's list of live
    /// tables ([`live_tables`]).
    pub fn new(max_sessions: usize) -> Self {
        Self::new_in(max_sessions, live_tables())
    }

    /// [`SessionTable::new`], in the list `live`.
    pub fn new_in(max_sessions: usize, live: &'static LiveTables) -> Self {
        let table = SessionTable {
            shared: Arc::new(TableShared {
                sessions: Mutex::new(Sessions {
                    map: IdMap::with_capacity_and_hasher(
                        2 * max_sessions.min(MAX_PRERESERVED),
                        Default::default(),
                    ),
                }),
                closes: AtomicU64::new(0),
                posts: Mutex::new(Vec::new()),
                posted: AtomicU64::new(0),
                applied: AtomicU64::new(0),
                live,
            }),
        };
        live.register(&table.shared);
        table
    }

    /// Locks the table, having applied what the registry posted to it. A
    /// poisoned lock (a panic elsewhere while it was held) still holds a
    /// consistent map: every update is one insert or remove.
    pub fn lock(&self) -> MutexGuard<'_, Sessions> {
        let mut s = self.shared.sessions.lock().unwrap_or_else(|e| e.into_inner());
        self.shared.apply(&mut s);
        s
    }

    /// Applies what was posted if the table's lock is free; false if a
    /// batch holds it.
    fn try_apply(&self) -> bool {
        let mut s = match self.shared.sessions.try_lock() {
            Ok(s) => s,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => return false,
        };
        self.shared.apply(&mut s);
        true
    }

    /// Posts `u`; returns the number of posts so far, which
    /// [`SessionTable::applied`] reaches once it has been applied. Once
    /// the process's tables are wiped, `u` is dropped (a session's key
    /// zeroized) instead (`LiveTables::wipe_all` says why that is never
    /// too late).
    fn post(&self, u: Update) -> u64 {
        let mut posts = self.shared.posts.lock().unwrap_or_else(|e| e.into_inner());
        if self.shared.live.is_closed() {
            drop(u);
            return self.shared.posted.load(Ordering::Acquire);
        }
        posts.push(u);
        self.shared.posted.fetch_add(1, Ordering::Release) + 1
    }

    /// Whether the process's tables are being or were wiped for its exit
    /// ([`LiveTables::wipe_all`]). Read with this table locked, false
    /// means the table keeps its sessions until the lock is let go: the
    /// wipe sets the flag before it takes any table's lock.
    pub fn is_wiped(&self) -> bool {
        self.shared.live.is_closed()
    }

    /// Posts applied so far.
    fn applied(&self) -> u64 {
        self.shared.applied.load(Ordering::Acquire)
    }

    /// How many sessions were closed in this table so far (one atomic
    /// load, no lock): a worker that sees it change wipes its stack.
    pub fn closes(&self) -> u64 {
        self.shared.closes.load(Ordering::Acquire)
    }

    /// Number of sessions in the table.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

/// Creates a registry and `queues` tables connected to it, with ids of its
/// own from 1.
pub fn session_set(max_sessions: usize, queues: usize) -> (SessionRegistry, Vec<SessionTable>) {
    session_set_with_ids(max_sessions, queues, Arc::new(AtomicU64::new(1)))
}

/// [`session_set`] with ids drawn from `ids` (the daemon's, shared by all
/// its connections).
pub fn session_set_with_ids(
    max_sessions: usize,
    queues: usize,
    ids: SessionIds,
) -> (SessionRegistry, Vec<SessionTable>) {
    session_set_in(max_sessions, queues, ids, live_tables())
}

/// [`session_set_with_ids`] with the tables in the list `live`.
pub fn session_set_in(
    max_sessions: usize,
    queues: usize,
    ids: SessionIds,
    live: &'static LiveTables,
) -> (SessionRegistry, Vec<SessionTable>) {
    let tables: Vec<SessionTable> = (0..queues)
        .map(|_| SessionTable::new_in(max_sessions, live))
        .collect();
    (SessionRegistry::new(max_sessions, tables.clone(), ids), tables)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_core::{Rng as _, SeedableRng};
    use rand_xoshiro::SplitMix64;

    fn info(key_len: u32, direction: u8) -> SymSessionInfo {
        let mut i = SymSessionInfo {
            cipher_alg: VIRTIO_CRYPTO_CIPHER_AES_CBC,
            key_len,
            op_type: 1,
            direction,
            ..Default::default()
        };
        i.cipher_key[..16].copy_from_slice(&[0x2b; 16]);
        i
    }

    #[test]
    fn ids_start_at_one_and_are_never_reused() {
        let (mut reg, tables) = session_set(4, 2);
        assert_eq!(reg.create(&info(16, 1)), 1);
        assert_eq!(reg.create(&info(24, 2)), 2);
        assert!(reg.close(1));
        assert_eq!(reg.create(&info(32, 1)), 3);
        for t in &tables {
            let t = t.lock();
            assert!(t.get(1).is_none());
            assert_eq!(t.get(2).unwrap().direction, Direction::Decrypt);
            assert_eq!(t.get(3).unwrap().key.key_bits(), 256);
            assert_eq!(t.len(), 2);
        }
    }

    #[test]
    fn bad_creates_get_negative_ids() {
        let (mut reg, _t) = session_set(1, 1);
        assert_eq!(reg.create(&info(17, 1)), -1, "key_len 17");
        assert_eq!(reg.create(&info(0, 1)), -1, "key_len 0");
        assert_eq!(reg.create(&info(64, 1)), -1, "key_len 64");
        assert_eq!(reg.create(&info(0x1000, 1)), -1, "key_len 0x1000");
        assert_eq!(reg.create(&info(16, 0)), -1, "direction 0");
        assert_eq!(reg.create(&info(16, 3)), -1, "direction 3");
        let mut i = info(16, 1);
        i.cipher_alg = 4;
        assert_eq!(reg.create(&i), -3, "AES-CTR not supported");
        let mut i = info(16, 1);
        i.op_type = 2;
        assert_eq!(reg.create(&i), -3, "chaining without hash_mode AUTH");
        let mut i = info(16, 1);
        i.op_code = 0x404;
        assert_eq!(reg.create(&i), -3, "akcipher");
        assert_eq!(reg.create(&info(16, 1)), 1);
        assert_eq!(reg.create(&info(16, 1)), -5, "table full");
        assert_eq!(reg.len(), 1);
    }

    fn alg_chain_info(
        direction: u8,
        order: u8,
        hash_alg: u32,
        auth_key_len: u32,
        digest: u32,
    ) -> SymSessionInfo {
        let mut i = info(16, direction);
        i.op_type = 2;
        i.hash_mode = 2;
        i.alg_chain_order = order;
        i.hash_alg = hash_alg;
        i.auth_key_len = auth_key_len;
        i.hash_result_len = digest;
        i
    }

    #[test]
    fn chaining_sessions() {
        let (mut reg, tables) = session_set(64, 1);
        // encrypt + CIPHER_THEN_HASH (2), decrypt + HASH_THEN_CIPHER (1).
        assert_eq!(reg.create(&alg_chain_info(1, 2, 2, 20, 12)), 1);
        assert_eq!(reg.create(&alg_chain_info(2, 1, 4, 512, 32)), 2);
        assert_eq!(
            reg.create(&alg_chain_info(1, 2, 4, 0, 1)),
            3,
            "empty auth key, 1-byte digest"
        );
        {
            let t = tables[0].lock();
            let m = t.get(1).unwrap().mac.as_ref().unwrap();
            assert_eq!((m.alg(), m.digest_len()), (MacAlg::HmacSha1, 12));
            let m = t.get(2).unwrap().mac.as_ref().unwrap();
            assert_eq!((m.alg(), m.digest_len()), (MacAlg::HmacSha256, 32));
        }
        // The other two combinations, other MACs, other hash modes, AAD: NOTSUPP.
        assert_eq!(
            reg.create(&alg_chain_info(1, 1, 2, 20, 20)),
            -3,
            "encrypt + HASH_THEN_CIPHER"
        );
        assert_eq!(
            reg.create(&alg_chain_info(2, 2, 2, 20, 20)),
            -3,
            "decrypt + CIPHER_THEN_HASH"
        );
        assert_eq!(reg.create(&alg_chain_info(1, 0, 2, 20, 20)), -3, "order 0");
        for alg in [0, 1, 3, 5, 6, 26] {
            assert_eq!(reg.create(&alg_chain_info(1, 2, alg, 20, 16)), -3, "mac {alg}");
        }
        for mode in [0, 1, 3] {
            let mut i = alg_chain_info(1, 2, 2, 20, 20);
            i.hash_mode = mode;
            assert_eq!(reg.create(&i), -3, "hash_mode {mode}");
        }
        let mut i = alg_chain_info(1, 2, 2, 20, 20);
        i.aad_len = 8;
        assert_eq!(reg.create(&i), -3, "aad");
        // Bad lengths: ERR.
        assert_eq!(reg.create(&alg_chain_info(1, 2, 2, 513, 20)), -1, "auth key 513");
        assert_eq!(
            reg.create(&alg_chain_info(1, 2, 2, u32::MAX, 20)),
            -1,
            "auth key 2^32-1"
        );
        assert_eq!(reg.create(&alg_chain_info(1, 2, 2, 20, 0)), -1, "digest 0");
        assert_eq!(reg.create(&alg_chain_info(1, 2, 2, 20, 21)), -1, "digest > SHA-1");
        assert_eq!(
            reg.create(&alg_chain_info(1, 2, 4, 20, 33)),
            -1,
            "digest > SHA-256"
        );
        let mut i = alg_chain_info(1, 2, 2, 20, 20);
        i.key_len = 20;
        assert_eq!(reg.create(&i), -1, "cipher key 20");
        // A cipher session carries no MAC whatever its hash fields say.
        let mut i = alg_chain_info(1, 2, 2, 20, 20);
        i.op_type = 1;
        assert_eq!(reg.create(&i), 4);
        assert!(tables[0].lock().get(4).unwrap().mac.is_none());
        assert_eq!(reg.len(), 4);
    }

    /// A queue in a batch holds its table's lock: a CREATE does not wait
    /// for it, and the session is there for the queue's next batch.
    #[test]
    fn a_create_does_not_wait_for_a_batch() {
        use std::sync::atomic::AtomicBool;
        let (mut reg, tables) = session_set(8, 2);
        let done = Arc::new(AtomicBool::new(false));
        let (locked_tx, locked_rx) = std::sync::mpsc::channel();
        // The batch ends when the CREATE has returned, or after 10 s if
        // the CREATE waits for it.
        let batch = {
            let (t, done) = (tables[1].clone(), done.clone());
            std::thread::spawn(move || {
                let s = t.lock();
                locked_tx.send(()).unwrap();
                let until = std::time::Instant::now() + Duration::from_secs(10);
                while !done.load(Ordering::Relaxed) && std::time::Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(1));
                }
                let seen = s.get(1).is_some();
                let ended = std::time::Instant::now();
                drop(s);
                (seen, ended)
            })
        };
        locked_rx.recv().unwrap();
        assert_eq!(reg.create(&info(16, 1)), 1);
        let created = std::time::Instant::now();
        done.store(true, Ordering::Relaxed);
        let (seen, ended) = batch.join().unwrap();
        assert!(created < ended, "the CREATE waited for the batch to end");
        assert!(!seen, "applied while the batch ran");
        assert_eq!(tables[0].lock().get(1).unwrap().key.key_bits(), 128);
        assert_eq!(tables[1].lock().get(1).unwrap().key.key_bits(), 128);
    }

    /// A CLOSE returns once the busy queues' batches have ended, and not
    /// before: then the session is out of every table and each queue's
    /// worker is told to wipe its stack.
    #[test]
    fn a_close_waits_for_the_batches_that_could_use_the_session() {
        let (mut reg, tables) = session_set(8, 3);
        assert_eq!(reg.create(&info(16, 1)), 1);
        let (locked_tx, locked_rx) = std::sync::mpsc::channel();
        let batches: Vec<_> = [1usize, 2]
            .into_iter()
            .map(|q| {
                let (t, tx) = (tables[q].clone(), locked_tx.clone());
                std::thread::spawn(move || {
                    let s = t.lock();
                    assert!(s.get(1).is_some());
                    tx.send(()).unwrap();
                    std::thread::sleep(Duration::from_millis(100 * q as u64));
                    let ends = std::time::Instant::now();
                    drop(s);
                    ends
                })
            })
            .collect();
        locked_rx.recv().unwrap();
        locked_rx.recv().unwrap();
        assert!(reg.close(1));
        let closed = std::time::Instant::now();
        for b in batches {
            assert!(b.join().unwrap() <= closed, "CLOSE returned while a batch ran");
        }
        for t in &tables {
            assert_eq!(t.closes(), 1);
            assert!(t.lock().get(1).is_none());
        }
    }

    /// Sessions that come and go with up to `max_sessions` live (at most
    /// MAX_PRERESERVED) never make a table allocate again: removals leave
    /// tombstones, and with room for only `max_sessions` a table grows
    /// after some 100,000 CREATEs and CLOSEs around 1,000 live (at
    /// max_sessions 1,024 on x86_64, whose 16-wide control groups this
    /// depends on); with room for twice as many it rehashes in place.
    #[test]
    fn churn_up_to_max_sessions_never_grows_a_table() {
        for max in [8usize, 1024, MAX_PRERESERVED] {
            let (mut reg, tables) = session_set(max, 1);
            let room = tables[0].lock().map.capacity();
            let mut live: Vec<u64> = Vec::new();
            let mut rng = SplitMix64::seed_from_u64(0x9e37_79b9_7f4a_7c15);
            for op in 0..300_000 {
                let x = rng.next_u64();
                if live.len() < max * 7 / 8 || (live.len() < max && x % 2 == 0) {
                    let id = reg.create(&info(16, 1));
                    assert!(id > 0, "max {max}, op {op}: {id}");
                    live.push(id as u64);
                } else {
                    let id = live.swap_remove((x >> 8) as usize % live.len());
                    assert!(reg.close(id));
                }
                let now = tables[0].lock().map.capacity();
                assert!(
                    now <= room,
                    "max {max}, op {op}: the table grew from {room} to {now} with {} live",
                    live.len()
                );
            }
        }
    }

    #[test]
    fn close_of_unknown_id_is_ignored() {
        let (mut reg, t) = session_set(8, 1);
        assert!(!reg.close(0));
        assert!(!reg.close(42));
        assert_eq!(reg.create(&info(16, 1)), 1);
        assert!(reg.close(1));
        assert!(!reg.close(1), "double close");
        assert!(t[0].is_empty());
    }
}
