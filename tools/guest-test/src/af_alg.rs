//! Minimal AF_ALG `skcipher` client built on raw `libc` calls.
//!
//! A [`Tfm`] is the bound "transform" socket (`socket` + `bind` +
//! `setsockopt(ALG_SET_KEY)`); every `accept` on it yields an [`Op`] socket
//! that carries requests: `sendmsg` with `ALG_SET_OP` / `ALG_SET_IV` control
//! messages and the input, then `read` of the output.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// AES block size, which is also the CBC IV size.
pub const BLOCK: usize = 16;

fn os_err(what: &str) -> String {
    format!("{what}: {}", io::Error::last_os_error())
}

/// Converts a buffer length to the socket API's length type.
fn socklen(len: usize) -> Result<libc::socklen_t, String> {
    libc::socklen_t::try_from(len).map_err(|_| format!("length {len} too large"))
}

/// A bound AF_ALG `skcipher` socket for one driver (a crypto "tfm").
pub struct Tfm {
    fd: OwnedFd,
    driver: String,
}

impl Tfm {
    /// Opens an AF_ALG socket and binds it to `driver` (a driver name such as
    /// `virtio_crypto_aes_cbc`, which selects exactly that implementation).
    pub fn bind(driver: &str) -> Result<Self, String> {
        // SAFETY: socket() takes no pointers; the returned value is checked below.
        let raw = unsafe { libc::socket(libc::AF_ALG, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(os_err("socket(AF_ALG, SOCK_SEQPACKET)"));
        }
        // SAFETY: `raw` is a freshly created descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };

        // SAFETY: sockaddr_alg is a plain C struct of integers and byte
        // arrays, for which all-zero bytes are a valid value.
        let mut sa: libc::sockaddr_alg = unsafe { std::mem::zeroed() };
        sa.salg_family = libc::AF_ALG as libc::sa_family_t;
        let ty = b"skcipher";
        sa.salg_type[..ty.len()].copy_from_slice(ty);
        let name = driver.as_bytes();
        if name.len() >= sa.salg_name.len() {
            return Err(format!("driver name {driver:?} too long"));
        }
        sa.salg_name[..name.len()].copy_from_slice(name);

        // SAFETY: `sa` is a fully initialised sockaddr_alg that outlives the
        // call, and the length passed is exactly its size.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&raw const sa).cast::<libc::sockaddr>(),
                socklen(std::mem::size_of::<libc::sockaddr_alg>())?,
            )
        };
        if rc != 0 {
            return Err(os_err(&format!("bind(skcipher, {driver})")));
        }
        Ok(Self {
            fd,
            driver: driver.to_owned(),
        })
    }

    /// The driver name this socket is bound to.
    pub fn driver(&self) -> &str {
        &self.driver
    }

    /// Sets the key. The kernel refuses (EBUSY) while any [`Op`] accepted
    /// from this tfm is still open, so drop those first.
    pub fn set_key(&self, key: &[u8]) -> Result<(), String> {
        // SAFETY: the pointer and length describe the live `key` slice, which
        // the kernel only reads during the call.
        let rc = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_ALG,
                libc::ALG_SET_KEY,
                key.as_ptr().cast::<libc::c_void>(),
                socklen(key.len())?,
            )
        };
        if rc != 0 {
            return Err(os_err(&format!(
                "setsockopt(ALG_SET_KEY, {} bytes) on {}",
                key.len(),
                self.driver
            )));
        }
        Ok(())
    }

    /// Creates a request socket for the current key.
    pub fn accept(&self) -> Result<Op, String> {
        // SAFETY: null address pointers are allowed by accept4(); the result
        // is checked below.
        let raw = unsafe {
            libc::accept4(
                self.fd.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        if raw < 0 {
            return Err(os_err(&format!("accept on {}", self.driver)));
        }
        // SAFETY: `raw` is a freshly accepted descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(Op {
            fd,
            driver: self.driver.clone(),
        })
    }
}

/// An accepted AF_ALG request socket.
pub struct Op {
    fd: OwnedFd,
    driver: String,
}

impl Op {
    /// Encrypts or decrypts `input` with `iv` into `out` (same length, a
    /// multiple of [`BLOCK`]) as one request.
    pub fn crypt(&self, encrypt: bool, iv: &[u8; BLOCK], input: &[u8], out: &mut [u8]) -> Result<(), String> {
        self.send(encrypt, iv, input)?;
        self.recv(out, out.len())
    }

    /// Like [`Op::crypt`] but reads the output in pieces of `read_chunk`
    /// bytes, so the kernel runs one cipher request per piece and has to
    /// carry the chaining IV from one to the next.
    pub fn crypt_split_read(
        &self,
        encrypt: bool,
        iv: &[u8; BLOCK],
        input: &[u8],
        out: &mut [u8],
        read_chunk: usize,
    ) -> Result<(), String> {
        self.send(encrypt, iv, input)?;
        self.recv(out, read_chunk)
    }

    fn send(&self, encrypt: bool, iv: &[u8; BLOCK], input: &[u8]) -> Result<(), String> {
        let op_len: libc::c_uint = 4;
        let iv_len: libc::c_uint = 4 + BLOCK as libc::c_uint;
        // SAFETY: CMSG_SPACE only does arithmetic on its argument.
        let space = unsafe { libc::CMSG_SPACE(op_len) + libc::CMSG_SPACE(iv_len) } as usize;
        // u64 storage keeps the control buffer aligned for cmsghdr.
        let mut cbuf = vec![0u64; space.div_ceil(8)];

        let mut iov = libc::iovec {
            iov_base: input.as_ptr().cast_mut().cast::<libc::c_void>(),
            iov_len: input.len(),
        };
        // SAFETY: msghdr is a plain C struct for which all-zero is valid
        // (null pointers, zero lengths).
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast::<libc::c_void>();
        msg.msg_controllen = space;

        let op = if encrypt {
            libc::ALG_OP_ENCRYPT
        } else {
            libc::ALG_OP_DECRYPT
        } as u32;

        // SAFETY: `msg.msg_control` points at `cbuf`, which is zeroed, 8-byte
        // aligned and `space` bytes long: exactly room for one cmsg with 4
        // data bytes followed by one with 20. CMSG_FIRSTHDR/CMSG_NXTHDR
        // therefore return non-null pointers inside `cbuf` (checked anyway),
        // and every write below stays within the data area that CMSG_LEN
        // declares. Unaligned writes are used for the data words.
        unsafe {
            let c1 = libc::CMSG_FIRSTHDR(&raw const msg);
            if c1.is_null() {
                return Err("no room for ALG_SET_OP cmsg".into());
            }
            (*c1).cmsg_level = libc::SOL_ALG;
            (*c1).cmsg_type = libc::ALG_SET_OP;
            (*c1).cmsg_len = libc::CMSG_LEN(op_len) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c1).cast::<u32>(), op);

            let c2 = libc::CMSG_NXTHDR(&raw const msg, c1);
            if c2.is_null() {
                return Err("no room for ALG_SET_IV cmsg".into());
            }
            (*c2).cmsg_level = libc::SOL_ALG;
            (*c2).cmsg_type = libc::ALG_SET_IV;
            (*c2).cmsg_len = libc::CMSG_LEN(iv_len) as usize;
            let data = libc::CMSG_DATA(c2);
            // struct af_alg_iv { __u32 ivlen; __u8 iv[]; }
            std::ptr::write_unaligned(data.cast::<u32>(), BLOCK as u32);
            std::ptr::copy_nonoverlapping(iv.as_ptr(), data.add(4), BLOCK);
        }

        loop {
            // SAFETY: `msg` points at `iov` (describing the live `input`
            // slice, only read by the kernel) and at `cbuf`, all of which
            // outlive the call.
            let n = unsafe { libc::sendmsg(self.fd.as_raw_fd(), &raw const msg, 0) };
            if n < 0 {
                if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(os_err(&format!("sendmsg to {}", self.driver)));
            }
            let n = n as usize;
            if n != input.len() {
                return Err(format!(
                    "sendmsg to {}: short send {n} of {}",
                    self.driver,
                    input.len()
                ));
            }
            return Ok(());
        }
    }

    fn recv(&self, out: &mut [u8], chunk: usize) -> Result<(), String> {
        let mut done = 0;
        while done < out.len() {
            let want = chunk.min(out.len() - done);
            let dst = &mut out[done..done + want];
            // SAFETY: `dst` is a live, writable slice of exactly `want` bytes.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), dst.as_mut_ptr().cast::<libc::c_void>(), want) };
            if n < 0 {
                if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(os_err(&format!(
                    "read from {} at {done}/{}",
                    self.driver,
                    out.len()
                )));
            }
            if n == 0 {
                return Err(format!("read from {}: EOF at {done}/{}", self.driver, out.len()));
            }
            done += n as usize;
        }
        Ok(())
    }
}
