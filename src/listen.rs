// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Where the daemon meets its frontends: a socket path it binds
//! (`--socket-path`), or a Unix socket it inherits as a descriptor
//! (`--fd`, QEMU's `docs/interop/vhost-user.rst`, "Backend program
//! conventions").
//!
//! An inherited socket is either listening (`SO_ACCEPTCONN`: systemd's
//! socket activation, a test harness), served like a bound path, one
//! frontend after another; or already connected (libvirt passes some
//! backends one end of a `socketpair`), served as a single connection.

use std::fmt;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;

/// Where the frontends come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    /// A socket file the daemon binds (`--socket-path`).
    Path(PathBuf),
    /// A Unix stream socket inherited as this descriptor (`--fd`).
    Fd(RawFd),
}

impl fmt::Display for Listen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Listen::Path(p) => write!(f, "{}", p.display()),
            Listen::Fd(fd) => write!(f, "descriptor {fd} (--fd)"),
        }
    }
}

/// A socket inherited with `--fd`, checked.
#[derive(Debug)]
pub enum Inherited {
    /// A listening socket: frontends connect to it, one after another.
    Listener(UnixListener),
    /// A connected socket: one frontend, whose end is elsewhere.
    Connected(UnixStream),
}

/// Why an inherited descriptor cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum FdError {
    /// The descriptor is not open, or a call on it failed.
    #[error("descriptor {0} (--fd): {1}")]
    Io(RawFd, io::Error),
    /// The descriptor is open but not the kind of socket a frontend uses.
    #[error("descriptor {0} (--fd) is {1}, not a Unix stream socket")]
    Kind(RawFd, &'static str),
}

/// An `int` socket option of `fd` (getsockopt(2), `SOL_SOCKET`).
fn sockopt(fd: RawFd, name: libc::c_int) -> io::Result<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt(2) writing at most `len` bytes into an int of ours.
    let r = unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, name, (&raw mut v).cast(), &mut len) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(v)
    }
}

/// Checks that `fd` is an open `AF_UNIX` `SOCK_STREAM` socket, marks it
/// close-on-exec (the memory-check helper this daemon spawns must not
/// hold the frontends' socket), makes it blocking (the daemon's accept and
/// reads wait; the flag belongs to the open file, which the passing
/// process shares) and takes ownership of it.
///
/// # Errors
/// [`FdError::Io`] for a descriptor that is not open or whose flags
/// cannot be read or set, [`FdError::Kind`] for anything but a Unix
/// stream socket.
pub fn inherit(fd: RawFd) -> Result<Inherited, FdError> {
    let io_err = |e: io::Error| FdError::Io(fd, e);
    // SAFETY: `libc::stat` is plain integers, for which zeroes are valid.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat(2) writing into a struct of ours; a descriptor that
    // is not open gives EBADF.
    if unsafe { libc::fstat(fd, &mut st) } < 0 {
        return Err(io_err(io::Error::last_os_error()));
    }
    let kind = match st.st_mode & libc::S_IFMT {
        libc::S_IFSOCK => None,
        libc::S_IFREG => Some("a regular file"),
        libc::S_IFDIR => Some("a directory"),
        libc::S_IFCHR => Some("a character device"),
        libc::S_IFBLK => Some("a block device"),
        libc::S_IFIFO => Some("a pipe"),
        _ => Some("not a socket"),
    };
    if let Some(kind) = kind {
        return Err(FdError::Kind(fd, kind));
    }
    if sockopt(fd, libc::SO_DOMAIN).map_err(io_err)? != libc::AF_UNIX {
        return Err(FdError::Kind(fd, "a socket of another family than AF_UNIX"));
    }
    if sockopt(fd, libc::SO_TYPE).map_err(io_err)? != libc::SOCK_STREAM {
        return Err(FdError::Kind(
            fd,
            "a Unix socket of another type than SOCK_STREAM",
        ));
    }
    let listening = sockopt(fd, libc::SO_ACCEPTCONN).map_err(io_err)? != 0;
    // SAFETY: fcntl(2) on an open descriptor (fstat succeeded).
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) } < 0 {
        return Err(io_err(io::Error::last_os_error()));
    }
    // SAFETY: `fd` is open (fstat succeeded), and the `--fd` convention
    // hands it to this process to own: nothing else in the daemon refers
    // to it, and it is taken here once (`daemon::run` calls this once).
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(if listening {
        let l = UnixListener::from(owned);
        l.set_nonblocking(false).map_err(io_err)?;
        Inherited::Listener(l)
    } else {
        let s = UnixStream::from(owned);
        s.set_nonblocking(false).map_err(io_err)?;
        Inherited::Connected(s)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, IntoRawFd};

    fn cloexec(fd: RawFd) -> bool {
        // SAFETY: fcntl(2) F_GETFD on a descriptor.
        unsafe { libc::fcntl(fd, libc::F_GETFD) & libc::FD_CLOEXEC != 0 }
    }

    /// A descriptor without close-on-exec (as a parent passes it).
    fn inheritable(fd: OwnedFd) -> RawFd {
        let raw = fd.into_raw_fd();
        // SAFETY: fcntl(2) on a descriptor we own.
        unsafe { libc::fcntl(raw, libc::F_SETFD, 0) };
        raw
    }

    #[test]
    fn a_listening_socket_is_a_listener_with_close_on_exec() {
        let dir = tempfile::tempdir().unwrap();
        let l = UnixListener::bind(dir.path().join("s")).unwrap();
        l.set_nonblocking(true).unwrap();
        let fd = inheritable(l.into());
        assert!(!cloexec(fd));
        let Ok(Inherited::Listener(l)) = inherit(fd) else {
            panic!("not a listener")
        };
        assert_eq!(l.as_raw_fd(), fd);
        assert!(cloexec(fd));
        // Blocking again: an accept with a client waiting returns it.
        let _c = UnixStream::connect(dir.path().join("s")).unwrap();
        l.accept().unwrap();
    }

    #[test]
    fn a_connected_socket_is_one_connection() {
        let (a, b) = UnixStream::pair().unwrap();
        let fd = inheritable(a.into());
        let Ok(Inherited::Connected(s)) = inherit(fd) else {
            panic!("not a connection")
        };
        assert!(cloexec(fd));
        use std::io::{Read, Write};
        (&b).write_all(b"x").unwrap();
        let mut got = [0u8];
        (&s).read_exact(&mut got).unwrap();
        assert_eq!(&got, b"x");
    }

    #[test]
    fn other_descriptors_are_refused() {
        let file = inheritable(tempfile::tempfile().unwrap().into());
        assert!(matches!(inherit(file), Err(FdError::Kind(_, "a regular file"))));
        let udp = inheritable(std::net::UdpSocket::bind("127.0.0.1:0").unwrap().into());
        assert!(matches!(inherit(udp), Err(FdError::Kind(..))), "AF_INET");
        let dgram = inheritable(std::os::unix::net::UnixDatagram::unbound().unwrap().into());
        assert!(matches!(inherit(dgram), Err(FdError::Kind(..))), "SOCK_DGRAM");
        // (None of these was taken: close them.)
        for fd in [file, udp, dgram] {
            // SAFETY: descriptors this test opened and owns.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        // A descriptor number far above any open one.
        assert!(matches!(inherit(1 << 20), Err(FdError::Io(_, e)) if e.raw_os_error() == Some(libc::EBADF)));
    }
}
