// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Run-time choice of the multi-buffer AES-CBC encryption engine.

use crate::{cbc_lanes, encrypt_aes_crate, encrypt_one, AesCbcKey, Error, Lane, AES_BLOCK_SIZE, MAX_LANES};
use std::sync::OnceLock;

/// Environment variable that picks the engine of [`aes_engine`]: `soft`,
/// `aesni`, `vaes256` or `vaes512` (ASCII case ignored). An unknown name,
/// or an engine this CPU cannot run, is ignored: the process then uses
/// [`AesEngine::detect`], and [`aes_engine_choice`] says so.
pub const AES_ENGINE_ENV: &str = "VHOST_USER_CRYPTO_AES_ENGINE";

/// An implementation of multi-buffer AES-CBC encryption
/// ([`cbc_encrypt_multi_with`]). All give the same output; they differ in
/// speed and in the CPU features they need.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AesEngine {
    /// One message after another through the `aes` crate's single-stream
    /// code, no interleaving. The `aes` crate picks its own backend: its
    /// constant-time software code on a CPU without AES-NI, AES-NI
    /// otherwise (`aes` 0.8 forces software only at build time, with
    /// `--cfg aes_force_soft`). Runs everywhere.
    Soft,
    /// The `aes` crate's AES-NI backend, 8 messages per pipelined call
    /// (16 lanes as two groups of 8). Needs AES-NI.
    AesNi,
    /// This crate's VAES kernel on 256-bit registers, 2 messages per
    /// register, up to 8 registers. Needs AES-NI, AVX2 and VAES (AMD Zen 3
    /// and later, Intel Ice Lake and later).
    Vaes256,
    /// This crate's VAES kernel on 512-bit registers, 4 messages per
    /// register, up to 4 registers. Needs AES-NI, AVX-512F and VAES (Intel
    /// Ice Lake and later, AMD Zen 4 and later). As the process-wide
    /// engine it also decrypts single messages ([`crate::CbcStream`]), 16
    /// blocks at a time.
    Vaes512,
}

impl AesEngine {
    /// Every engine, slowest first.
    pub const ALL: [AesEngine; 4] = [
        AesEngine::Soft,
        AesEngine::AesNi,
        AesEngine::Vaes256,
        AesEngine::Vaes512,
    ];

    /// The engine's name, as [`AES_ENGINE_ENV`] takes it and for logs.
    pub fn name(self) -> &'static str {
        match self {
            AesEngine::Soft => "soft",
            AesEngine::AesNi => "aesni",
            AesEngine::Vaes256 => "vaes256",
            AesEngine::Vaes512 => "vaes512",
        }
    }

    /// The engine named `name` (see [`AesEngine::name`]; ASCII case
    /// ignored), if any.
    pub fn from_name(name: &str) -> Option<AesEngine> {
        Self::ALL
            .into_iter()
            .find(|e| e.name().eq_ignore_ascii_case(name.trim()))
    }

    /// Whether this CPU can run the engine (CPUID, through
    /// `is_x86_feature_detected!`).
    pub fn is_supported(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            match self {
                AesEngine::Soft => true,
                AesEngine::AesNi => has!("aes"),
                AesEngine::Vaes256 => has!("aes") && has!("avx2") && has!("vaes"),
                AesEngine::Vaes512 => has!("aes") && has!("avx512f") && has!("vaes"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == AesEngine::Soft
        }
    }

    /// The engines this CPU can run, slowest first.
    pub fn available() -> Vec<AesEngine> {
        Self::ALL.into_iter().filter(|e| e.is_supported()).collect()
    }

    /// The fastest engine this CPU can run: VAES on 512-bit registers, then
    /// on 256-bit ones, then AES-NI, then [`AesEngine::Soft`].
    pub fn detect() -> AesEngine {
        Self::available().pop().unwrap_or(AesEngine::Soft)
    }
}

impl std::fmt::Display for AesEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A process-wide engine (AES or SHA) and how it was chosen from its
/// environment variable and the CPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineChoice<E> {
    /// The engine the process uses.
    pub engine: E,
    /// The value of the engine's environment variable, if it was set.
    pub requested: Option<String>,
    /// True if the variable was set but named no engine this CPU can run,
    /// so the engine's `detect` choice was taken instead.
    pub ignored: bool,
}

/// The AES engine of the process: [`cbc_encrypt_multi`](crate::cbc_encrypt_multi)
/// runs on it, chosen with [`AES_ENGINE_ENV`].
pub type AesEngineChoice = EngineChoice<AesEngine>;

impl<E> EngineChoice<E> {
    /// The choice for the value `requested` of an engine's environment
    /// variable, given `usable`, the engine it names if this CPU runs it:
    /// that engine, else `detect`'s, `ignored` when a value was set but
    /// named no usable engine.
    pub(crate) fn resolve(requested: Option<&str>, usable: Option<E>, detect: impl FnOnce() -> E) -> Self {
        EngineChoice {
            ignored: requested.is_some() && usable.is_none(),
            engine: usable.unwrap_or_else(detect),
            requested: requested.map(str::to_owned),
        }
    }
}

impl EngineChoice<AesEngine> {
    /// The choice for the value `requested` of [`AES_ENGINE_ENV`].
    pub fn from_request(requested: Option<&str>) -> AesEngineChoice {
        let usable = requested
            .and_then(AesEngine::from_name)
            .filter(|e| e.is_supported());
        Self::resolve(requested, usable, AesEngine::detect)
    }
}

/// The engine choice of this process, made once on first use from
/// [`AES_ENGINE_ENV`] and the CPU.
pub fn aes_engine_choice() -> &'static AesEngineChoice {
    static CHOICE: OnceLock<AesEngineChoice> = OnceLock::new();
    CHOICE.get_or_init(|| {
        let env = std::env::var(AES_ENGINE_ENV).ok();
        AesEngineChoice::from_request(env.as_deref())
    })
}

/// The engine [`cbc_encrypt_multi`](crate::cbc_encrypt_multi) uses in this
/// process ([`aes_engine_choice`]).
pub fn aes_engine() -> AesEngine {
    aes_engine_choice().engine
}

/// [`cbc_encrypt_multi`](crate::cbc_encrypt_multi) on the given engine.
///
/// # Errors
/// [`Error::InvalidBufferLength`] if more than [`MAX_LANES`] lanes are
/// given or a lane is not a whole number of blocks;
/// [`Error::EngineUnavailable`] if this CPU cannot run `engine`. Nothing is
/// processed then.
pub fn cbc_encrypt_multi_with(
    engine: AesEngine,
    key: &AesCbcKey,
    lanes: &mut [Lane<'_>],
) -> Result<(), Error> {
    if lanes.len() > MAX_LANES {
        return Err(Error::InvalidBufferLength(lanes.len()));
    }
    if let Some(l) = lanes.iter().find(|l| l.buf.len() % AES_BLOCK_SIZE != 0) {
        return Err(Error::InvalidBufferLength(l.buf.len()));
    }
    if !engine.is_supported() {
        return Err(Error::EngineUnavailable(engine.name()));
    }
    match (engine, lanes, &key.round_keys) {
        (AesEngine::Soft, lanes, _) => lanes.iter_mut().for_each(|l| encrypt_one(key, l)),
        // One message: the single-stream path, without the lanes'
        // bookkeeping per block.
        (_, [one], _) => encrypt_one(key, one),
        (AesEngine::Vaes512, lanes, Some(rk)) => {
            if !cbc_lanes::encrypt_vaes512(rk, lanes) {
                return Err(Error::EngineUnavailable(engine.name()));
            }
        }
        (AesEngine::Vaes256, lanes, Some(rk)) => {
            if !cbc_lanes::encrypt_vaes256(rk, lanes) {
                return Err(Error::EngineUnavailable(engine.name()));
            }
        }
        // AES-NI, or round keys missing (never on a CPU with AES-NI).
        (_, lanes, _) => encrypt_aes_crate(key, lanes),
    }
    Ok(())
}
