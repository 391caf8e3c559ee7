//! `guest-test`: runs inside the QEMU guest of the end-to-end test and drives
//! the virtio-crypto device through the guest kernel's AF_ALG interface.
//!
//! Checks, each printing one line per result:
//! 1. `/proc/crypto` shows `virtio_crypto_aes_cbc` with `selftest : passed`
//!    (the guest kernel's own crypto self-test of the device);
//! 2. NIST SP 800-38A F.2.1–F.2.6 known answers (also on the reference);
//! 3. a seeded random cross-check against the guest's `cbc-aes-aesni`;
//! 4. re-keying one tfm several times;
//! 5. a time-bounded throughput loop per chunk size.
//!
//! The last line is `GUEST-RESULT: PASS` or `GUEST-RESULT: FAIL <reasons>`;
//! the exit status is 0 only on PASS.

mod af_alg;

use af_alg::{Op, Tfm, BLOCK};
use rand_core::{Rng as _, SeedableRng as _};
use rand_xoshiro::SplitMix64;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Driver name of the virtio-crypto AES-CBC skcipher (priority 150).
const VIRTIO: &str = "virtio_crypto_aes_cbc";
/// Driver name of the guest's AES-NI CBC skcipher, used as the reference.
const REFERENCE: &str = "cbc-aes-aesni";
/// Largest request of the random cross-check.
const MAX_CROSS_SIZE: usize = 32 * 1024;
/// Chunk sizes of the speed loop.
const SPEED_SIZES: [usize; 5] = [64, 256, 1024, 4096, 16384];

const USAGE: &str = "usage: guest-test [--speed-secs F] [--ops N] [--seed N] [--wait-secs N] [--hang-secs N]
  --speed-secs F  seconds per chunk size in the speed loop (default 1, 0 = skip)
  --ops N         operations of the random cross-check (default 1000, minimum 300)
  --seed N        PRNG seed, decimal or 0x-hex (default: derived from the clock)
  --wait-secs N   how long to wait for the driver in /proc/crypto (default 20)
  --hang-secs N   give up (GUEST-RESULT: FAIL hang-...) after N s without progress (default 30)";

struct Config {
    speed_secs: f64,
    ops: usize,
    seed: u64,
    wait_secs: u64,
    hang_secs: u64,
}

fn parse_u64(s: &str) -> Result<u64, String> {
    let r = if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u64::from_str_radix(hex, 16)
    } else {
        s.parse()
    };
    r.map_err(|e| format!("bad number {s:?}: {e}"))
}

fn parse_args() -> Result<Config, String> {
    let mut cfg = Config {
        speed_secs: 1.0,
        ops: 1000,
        seed: clock_seed(),
        wait_secs: 20,
        hang_secs: 30,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let (name, inline) = match a.split_once('=') {
            Some((n, v)) => (n.to_owned(), Some(v.to_owned())),
            None => (a.clone(), None),
        };
        if name == "-h" || name == "--help" {
            return Err(USAGE.to_owned());
        }
        let value = match inline {
            Some(v) => v,
            None => args
                .next()
                .ok_or_else(|| format!("{name} needs a value\n{USAGE}"))?,
        };
        match name.as_str() {
            "--speed-secs" => {
                cfg.speed_secs = value
                    .parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite() && *v >= 0.0)
                    .ok_or_else(|| format!("bad --speed-secs {value:?}"))?;
            }
            "--ops" => {
                cfg.ops = usize::try_from(parse_u64(&value)?).map_err(|e| e.to_string())?;
                if cfg.ops < 300 {
                    return Err(format!("--ops must be at least 300, got {}", cfg.ops));
                }
            }
            "--seed" => cfg.seed = parse_u64(&value)?,
            "--wait-secs" => cfg.wait_secs = parse_u64(&value)?,
            "--hang-secs" => cfg.hang_secs = parse_u64(&value)?.max(1),
            _ => return Err(format!("unknown argument {name:?}\n{USAGE}")),
        }
    }
    Ok(cfg)
}

fn clock_seed() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let s = now.as_nanos() as u64 ^ u64::from(std::process::id()).rotate_left(32);
    // One SplitMix64 round so that close clocks give unrelated seeds.
    SplitMix64::seed_from_u64(s).next_u64()
}

/// The test's picks (sizes, keys, IVs, data) from `rand_xoshiro`'s
/// SplitMix64 started at state `seed`, so a `--seed` gives the same
/// requests run after run.
struct Picks(SplitMix64);

impl Picks {
    fn new(seed: u64) -> Picks {
        Picks(SplitMix64::seed_from_u64(seed))
    }
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }
    /// Uniform-ish value in `lo..=hi` (the modulo bias is irrelevant here).
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }
    fn fill(&mut self, buf: &mut [u8]) {
        self.0.fill_bytes(buf);
    }
    fn key(&mut self) -> Vec<u8> {
        let len = [16, 24, 32][self.range(0, 2)];
        let mut k = vec![0; len];
        self.fill(&mut k);
        k
    }
    fn iv(&mut self) -> [u8; BLOCK] {
        let mut iv = [0; BLOCK];
        self.fill(&mut iv);
        iv
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    let s: Vec<u8> = s.bytes().filter(|c| !c.is_ascii_whitespace()).collect();
    s.chunks(2)
        .map(|p| {
            let d = |c: u8| (c as char).to_digit(16).expect("hex digit") as u8;
            d(p[0]) << 4 | d(p[1])
        })
        .collect()
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

fn dir_name(encrypt: bool) -> &'static str {
    if encrypt {
        "encrypt"
    } else {
        "decrypt"
    }
}

// ---------------------------------------------------------------------------
// Watchdog: a request the device never completes blocks read() for ever.
// The watchdog names the step that stalled and ends the run with a verdict,
// long before the host's timeout kills QEMU.

/// Milliseconds since `EPOCH` at the last progress report.
static LAST_PROGRESS_MS: AtomicU64 = AtomicU64::new(0);
static STEP: Mutex<String> = Mutex::new(String::new());
static EPOCH: OnceLock<Instant> = OnceLock::new();

fn now_ms() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// Records progress; `step` describes what runs next (shown if it stalls).
fn progress(step: impl FnOnce() -> String) {
    LAST_PROGRESS_MS.store(now_ms(), Ordering::Relaxed);
    if let Ok(mut s) = STEP.lock() {
        *s = step();
    }
}

/// Records progress without changing the step description.
fn tick() {
    LAST_PROGRESS_MS.store(now_ms(), Ordering::Relaxed);
}

fn start_watchdog(hang_secs: u64) {
    progress(|| "start".into());
    std::thread::spawn(move || {
        let mut warned = 0;
        loop {
            std::thread::sleep(Duration::from_secs(1));
            let idle = now_ms().saturating_sub(LAST_PROGRESS_MS.load(Ordering::Relaxed)) / 1000;
            if idle < 5 {
                warned = 0;
                continue;
            }
            let step = STEP.lock().map(|s| s.clone()).unwrap_or_default();
            if idle >= hang_secs {
                println!("WATCHDOG: no progress for {idle} s in: {step}; giving up");
                let tag: String = step
                    .split_whitespace()
                    .next()
                    .unwrap_or("unknown")
                    .chars()
                    .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
                    .collect();
                println!("GUEST-RESULT: FAIL hang-in-{tag}");
                std::process::exit(3);
            }
            if idle / 5 > warned {
                warned = idle / 5;
                println!("WATCHDOG: no progress for {idle} s in: {step}");
            }
        }
    });
}

// ---------------------------------------------------------------------------
// /proc/crypto

/// Returns the `/proc/crypto` block (lines) whose `driver` is `driver`.
fn proc_crypto_block(driver: &str) -> Result<Option<Vec<String>>, String> {
    let text = std::fs::read_to_string("/proc/crypto").map_err(|e| format!("read /proc/crypto: {e}"))?;
    for block in text.split("\n\n") {
        let lines: Vec<String> = block
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_owned)
            .collect();
        let is_it = lines.iter().any(|l| {
            l.split_once(':')
                .is_some_and(|(k, v)| k.trim() == "driver" && v.trim() == driver)
        });
        if is_it {
            return Ok(Some(lines));
        }
    }
    Ok(None)
}

fn field<'a>(block: &'a [String], name: &str) -> Option<&'a str> {
    block.iter().find_map(|l| {
        l.split_once(':')
            .filter(|(k, _)| k.trim() == name)
            .map(|(_, v)| v.trim())
    })
}

/// Waits for `driver` to show up in /proc/crypto, prints its block.
fn wait_proc_block(driver: &str, wait: Duration) -> Result<Vec<String>, String> {
    let start = Instant::now();
    loop {
        tick();
        if let Some(block) = proc_crypto_block(driver)? {
            return Ok(block);
        }
        if start.elapsed() >= wait {
            return Err(format!(
                "driver {driver} not in /proc/crypto after {} s",
                wait.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn check_selftest(cfg: &Config, fails: &mut Vec<String>) -> bool {
    println!("== /proc/crypto");
    let mut found = true;
    for driver in [VIRTIO, REFERENCE] {
        match wait_proc_block(driver, Duration::from_secs(cfg.wait_secs)) {
            Ok(block) => {
                println!("/proc/crypto block for driver {driver}:");
                for l in &block {
                    println!("  {l}");
                }
                let st = field(&block, "selftest").unwrap_or("(no selftest field)");
                if st == "passed" {
                    println!("SELFTEST {driver}: passed (/proc/crypto shows \"selftest : passed\")");
                } else {
                    println!("SELFTEST {driver}: NOT passed (/proc/crypto shows \"selftest : {st}\")");
                    fails.push(format!("selftest-{driver}"));
                }
            }
            Err(e) => {
                println!("SELFTEST {driver}: MISSING ({e})");
                fails.push(format!("missing-{driver}"));
                found = false;
            }
        }
    }
    found
}

// ---------------------------------------------------------------------------
// NIST SP 800-38A, appendix F.2 (CBC)

const NIST_IV: &str = "000102030405060708090a0b0c0d0e0f";
const NIST_PLAIN: &str = "6bc1bee22e409f96e93d7e117393172a ae2d8a571e03ac9c9eb76fac45af8e51
                          30c81c46a35ce411e5fbc1191a0a52ef f69f2445df4f9b17ad2b417be66c3710";

struct NistKey {
    bits: u32,
    key: &'static str,
    cipher: &'static str,
    /// Sections: (encrypt, decrypt).
    sections: (&'static str, &'static str),
}

const NIST: [NistKey; 3] = [
    NistKey {
        bits: 128,
        key: "2b7e151628aed2a6abf7158809cf4f3c",
        cipher: "7649abac8119b246cee98e9b12e9197d 5086cb9b507219ee95db113a917678b2
                 73bed6b8e3c1743b7116e69e22229516 3ff1caa1681fac09120eca307586e1a7",
        sections: ("F.2.1", "F.2.2"),
    },
    NistKey {
        bits: 192,
        key: "8e73b0f7da0e6452c810f32b809079e562f8ead2522c6b7b",
        cipher: "4f021db243bc633d7178183a9fa071e8 b4d9ada9ad7dedf4e5e738763f69145a
                 571b242012fb7ae07fa9baac3df102e0 08b0e27988598881d920a9e64f5615cd",
        sections: ("F.2.3", "F.2.4"),
    },
    NistKey {
        bits: 256,
        key: "603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4",
        cipher: "f58c4c04d6e5f1ba779eabfb5f7bfbd6 9cfc4e967edb808d679f777bc6702c7d
                 39f23369a9d9bacfa530e26304231461 b2eb05e2c39be9fcda6c19078c6a9d1b",
        sections: ("F.2.5", "F.2.6"),
    },
];

/// Runs one known answer: whole request, then the same with the output read
/// one block at a time (one kernel request per block, chaining the IV).
fn nist_one(tfm: &Tfm, v: &NistKey, encrypt: bool) -> Result<(), String> {
    let plain = unhex(NIST_PLAIN);
    let cipher = unhex(v.cipher);
    let iv: [u8; BLOCK] = unhex(NIST_IV).try_into().expect("16-byte IV");
    let (input, expect) = if encrypt {
        (&plain, &cipher)
    } else {
        (&cipher, &plain)
    };
    tfm.set_key(&unhex(v.key))?;
    let op = tfm.accept()?;
    let mut out = vec![0; input.len()];
    op.crypt(encrypt, &iv, input, &mut out)?;
    if out != *expect {
        return Err(format!("got {} want {}", hex(&out), hex(expect)));
    }
    let mut out = vec![0; input.len()];
    op.crypt_split_read(encrypt, &iv, input, &mut out, BLOCK)?;
    if out != *expect {
        return Err(format!(
            "block-by-block read: got {} want {}",
            hex(&out),
            hex(expect)
        ));
    }
    Ok(())
}

fn nist_all(driver: &str, fails: &mut Vec<String>) {
    println!("== NIST SP 800-38A CBC known answers on {driver}");
    let tfm = match Tfm::bind(driver) {
        Ok(t) => t,
        Err(e) => {
            println!("KAT {driver}: 0/6 ok (cannot bind: {e})");
            fails.push(format!("kat-{driver}"));
            return;
        }
    };
    let mut ok = 0;
    for v in &NIST {
        for encrypt in [true, false] {
            let section = if encrypt { v.sections.0 } else { v.sections.1 };
            let name = format!(
                "{section} CBC-AES{}.{}",
                v.bits,
                if encrypt { "Encrypt" } else { "Decrypt" }
            );
            progress(|| format!("kat {name} on {driver}"));
            match nist_one(&tfm, v, encrypt) {
                Ok(()) => {
                    ok += 1;
                    println!("KAT {name} on {}: ok", tfm.driver());
                }
                Err(e) => println!("KAT {name} on {}: FAIL {e}", tfm.driver()),
            }
        }
    }
    println!("KAT {driver}: {ok}/6 ok");
    if ok != 6 {
        fails.push(format!("kat-{driver}"));
    }
}

// ---------------------------------------------------------------------------
// Random cross-check against the reference driver

/// A virtio tfm and a reference tfm that always hold the same key.
struct Pair {
    dev: Tfm,
    reference: Tfm,
    ops: Option<(Op, Op)>,
}

impl Pair {
    fn new() -> Result<Self, String> {
        Ok(Self {
            dev: Tfm::bind(VIRTIO)?,
            reference: Tfm::bind(REFERENCE)?,
            ops: None,
        })
    }

    /// Re-keys both tfms (closing the open request sockets first).
    fn set_key(&mut self, key: &[u8]) -> Result<(), String> {
        self.ops = None;
        self.dev.set_key(key)?;
        self.reference.set_key(key)?;
        self.ops = Some((self.dev.accept()?, self.reference.accept()?));
        Ok(())
    }

    /// Runs one operation on both; returns (device output, reference output).
    fn run(&self, encrypt: bool, iv: &[u8; BLOCK], input: &[u8]) -> Result<(Vec<u8>, Vec<u8>), String> {
        let (dev, reference) = self.ops.as_ref().ok_or("no key set")?;
        let mut a = vec![0; input.len()];
        let mut b = vec![0; input.len()];
        dev.crypt(encrypt, iv, input, &mut a)?;
        reference.crypt(encrypt, iv, input, &mut b)?;
        Ok((a, b))
    }
}

/// Picks a request size: a multiple of 16 in 16..=32 KiB, biased towards
/// small sizes but covering the whole range.
fn pick_size(rng: &mut Picks, i: usize) -> usize {
    let max_blocks = MAX_CROSS_SIZE / BLOCK;
    let blocks = match i {
        0 => 1,
        1 => max_blocks,
        _ => match rng.range(0, 3) {
            0 => rng.range(1, 4),
            1 | 2 => rng.range(1, 256),
            _ => rng.range(1, max_blocks),
        },
    };
    blocks * BLOCK
}

fn cross_check(cfg: &Config, fails: &mut Vec<String>) {
    println!(
        "== random cross-check {VIRTIO} vs {REFERENCE}: seed=0x{:016x} ops={}",
        cfg.seed, cfg.ops
    );
    let mut rng = Picks::new(cfg.seed);
    let mut pair = match Pair::new() {
        Ok(p) => p,
        Err(e) => {
            println!("CROSSCHECK: FAIL setup: {e}");
            fails.push("crosscheck".into());
            return;
        }
    };
    let (mut mismatches, mut errors, mut bytes, mut rekeys) = (0usize, 0usize, 0usize, 0usize);
    let (mut enc, mut dec) = (0usize, 0usize);
    let mut key = Vec::new();
    let mut left_with_key = 0;
    let start = Instant::now();
    for i in 0..cfg.ops {
        if left_with_key == 0 {
            key = rng.key();
            left_with_key = rng.range(1, 12);
            rekeys += 1;
            progress(|| format!("crosscheck op {i}: set key ({} bits)", key.len() * 8));
            if let Err(e) = pair.set_key(&key) {
                println!("CROSSCHECK op {i}: ERROR set key ({} bits): {e}", key.len() * 8);
                errors += 1;
                break;
            }
        }
        left_with_key -= 1;
        let size = pick_size(&mut rng, i);
        let encrypt = rng.next() & 1 == 1;
        let iv = rng.iv();
        let mut input = vec![0; size];
        rng.fill(&mut input);
        if encrypt {
            enc += 1;
        } else {
            dec += 1;
        }
        bytes += size;
        progress(|| {
            format!(
                "crosscheck op {i}: {} aes-{} size {size}",
                dir_name(encrypt),
                key.len() * 8
            )
        });
        match pair.run(encrypt, &iv, &input) {
            Ok((dev, reference)) => {
                if let Some(at) = first_difference(&dev, &reference) {
                    mismatches += 1;
                    if mismatches <= 10 {
                        let end = (at + BLOCK).min(size);
                        println!(
                            "CROSSCHECK op {i}: MISMATCH {} aes-{} size {size} iv {} at byte {at}: \
                             {VIRTIO} {} vs {REFERENCE} {}",
                            dir_name(encrypt),
                            key.len() * 8,
                            hex(&iv),
                            hex(&dev[at..end]),
                            hex(&reference[at..end]),
                        );
                    }
                }
            }
            Err(e) => {
                errors += 1;
                println!(
                    "CROSSCHECK op {i}: ERROR {} aes-{} size {size}: {e}",
                    dir_name(encrypt),
                    key.len() * 8
                );
                if errors >= 5 {
                    println!("CROSSCHECK: giving up after {errors} errors");
                    break;
                }
            }
        }
        if (i + 1) % 100 == 0 {
            println!(
                "CROSSCHECK progress: {} ops, {mismatches} mismatches, {:.1} s",
                i + 1,
                start.elapsed().as_secs_f64()
            );
        }
    }
    let verdict = if mismatches == 0 && errors == 0 {
        "ok"
    } else {
        fails.push("crosscheck".into());
        "FAIL"
    };
    println!(
        "CROSSCHECK: {verdict} seed=0x{:016x} ops={} of {} (encrypt {enc}, decrypt {dec}, keys {rekeys}) \
         bytes={bytes} mismatches={mismatches} errors={errors} time={:.1}s",
        cfg.seed,
        enc + dec,
        cfg.ops,
        start.elapsed().as_secs_f64()
    );
}

// ---------------------------------------------------------------------------
// Re-keying one tfm

fn rekey(cfg: &Config, fails: &mut Vec<String>) {
    println!("== rekey: one {VIRTIO} tfm socket, several keys in turn");
    match rekey_inner(cfg) {
        Ok(summary) => println!("REKEY: ok ({summary})"),
        Err(e) => {
            println!("REKEY: FAIL {e}");
            fails.push("rekey".into());
        }
    }
}

fn rekey_inner(cfg: &Config) -> Result<String, String> {
    let mut rng = Picks::new(cfg.seed ^ 0x5245_4b45_595f_5445);
    let dev = Tfm::bind(VIRTIO)?;
    let reference = Tfm::bind(REFERENCE)?;
    // 128 -> 256 -> 192 -> 128 again (a different key) -> back to the first.
    let mut keys: Vec<Vec<u8>> = [16, 32, 24, 16]
        .iter()
        .map(|&len| {
            let mut k = vec![0; len];
            rng.fill(&mut k);
            k
        })
        .collect();
    keys.push(keys[0].clone());
    let mut ops = 0;
    // Data that is the same for every key, so a stale session would show.
    let iv = rng.iv();
    let mut data = vec![0; 4096];
    rng.fill(&mut data);
    let mut previous: Option<Vec<u8>> = None;
    for (n, key) in keys.iter().enumerate() {
        dev.set_key(key)
            .map_err(|e| format!("key #{n} ({} bits): {e}", key.len() * 8))?;
        reference.set_key(key)?;
        let d = dev.accept()?;
        let r = reference.accept()?;
        for (k, size) in [16usize, 64, 1024, 4096].into_iter().enumerate() {
            for encrypt in [true, false] {
                let input = &data[..size];
                let mut a = vec![0; size];
                let mut b = vec![0; size];
                progress(|| {
                    format!(
                        "rekey key #{n} ({} bits) {} size {size}",
                        key.len() * 8,
                        dir_name(encrypt)
                    )
                });
                d.crypt(encrypt, &iv, input, &mut a)
                    .map_err(|e| format!("key #{n}: {e}"))?;
                r.crypt(encrypt, &iv, input, &mut b)?;
                ops += 1;
                if let Some(at) = first_difference(&a, &b) {
                    return Err(format!(
                        "key #{n} ({} bits) {} size {size}: mismatch at byte {at}",
                        key.len() * 8,
                        dir_name(encrypt)
                    ));
                }
                if encrypt && k == 3 {
                    // The same data under the previous key must differ.
                    if previous.as_deref() == Some(&a[..]) && n != 0 {
                        let same_as_before = keys[n - 1] == *key;
                        if !same_as_before {
                            return Err(format!("key #{n}: output equals the previous key's"));
                        }
                    }
                    previous = Some(a);
                }
            }
        }
        // `d` and `r` drop here, so the next set_key is allowed.
        println!(
            "REKEY key #{n} ({} bits): {} ops matched {REFERENCE}",
            key.len() * 8,
            ops
        );
    }
    Ok(format!("{} keys, {ops} ops, all matched {REFERENCE}", keys.len()))
}

// ---------------------------------------------------------------------------
// Speed

fn speed(cfg: &Config, fails: &mut Vec<String>) {
    if cfg.speed_secs <= 0.0 {
        println!("== speed: skipped (--speed-secs 0)");
        return;
    }
    println!(
        "== speed: AES-128-CBC encrypt on {VIRTIO}, one request in flight, {} s per size",
        cfg.speed_secs
    );
    if let Err(e) = speed_inner(cfg) {
        println!("SPEED: FAIL {e}");
        fails.push("speed".into());
    }
}

fn speed_inner(cfg: &Config) -> Result<(), String> {
    let key = unhex(NIST[0].key);
    let iv = [0x5a; BLOCK];
    let dev = Tfm::bind(VIRTIO)?;
    dev.set_key(&key)?;
    let op = dev.accept()?;
    let reference = Tfm::bind(REFERENCE)?;
    reference.set_key(&key)?;
    let rop = reference.accept()?;
    let budget = Duration::from_secs_f64(cfg.speed_secs);
    let mut rng = Picks::new(cfg.seed ^ 0x0053_5045_4544);
    for size in SPEED_SIZES {
        let mut input = vec![0; size];
        rng.fill(&mut input);
        let mut out = vec![0; size];
        let mut packets: u64 = 0;
        progress(|| format!("speed chunks of {size} bytes"));
        let start = Instant::now();
        while packets == 0 || start.elapsed() < budget {
            op.crypt(true, &iv, &input, &mut out)
                .map_err(|e| format!("chunk {size} packet {packets}: {e}"))?;
            packets += 1;
            tick();
        }
        let secs = start.elapsed().as_secs_f64();
        let mib = (packets as f64) * (size as f64) / (1024.0 * 1024.0);
        println!(
            "Encrypting in chunks of {size} bytes: done. {mib:.2} MiB in {secs:.2} secs: {:.2} MiB/sec ({packets} packets)",
            mib / secs
        );
        // The last packet must still be right.
        let mut want = vec![0; size];
        rop.crypt(true, &iv, &input, &mut want)?;
        if let Some(at) = first_difference(&out, &want) {
            return Err(format!(
                "chunk {size}: last output differs from {REFERENCE} at byte {at}"
            ));
        }
    }
    println!("SPEED: ok");
    Ok(())
}

// ---------------------------------------------------------------------------

fn main() -> ExitCode {
    let cfg = match parse_args() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            println!("GUEST-RESULT: FAIL bad-arguments");
            return ExitCode::FAILURE;
        }
    };
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    println!(
        "guest-test {}: kernel {} speed-secs={} ops={} seed=0x{:016x} hang-secs={}",
        env!("CARGO_PKG_VERSION"),
        kernel.trim(),
        cfg.speed_secs,
        cfg.ops,
        cfg.seed,
        cfg.hang_secs
    );
    start_watchdog(cfg.hang_secs);
    let mut fails = Vec::new();
    let started = Instant::now();
    if check_selftest(&cfg, &mut fails) {
        nist_all(REFERENCE, &mut fails);
        nist_all(VIRTIO, &mut fails);
        cross_check(&cfg, &mut fails);
        rekey(&cfg, &mut fails);
        speed(&cfg, &mut fails);
    }
    println!("guest-test finished in {:.1} s", started.elapsed().as_secs_f64());
    if fails.is_empty() {
        println!("GUEST-RESULT: PASS");
        ExitCode::SUCCESS
    } else {
        println!("GUEST-RESULT: FAIL {}", fails.join(" "));
        ExitCode::FAILURE
    }
}
