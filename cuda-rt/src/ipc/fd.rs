//! Passing a file descriptor to another process over a Unix socket (`SCM_RIGHTS`),
//! with a few bytes of payload: how a stream-ordered pool exported as a POSIX file
//! descriptor ([`MemoryAsyncPool::export_fd`](crate::memory::MemoryAsyncPool::export_fd))
//! reaches the importing process, whose descriptor table must receive it from the
//! kernel (the number alone means nothing elsewhere).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use crate::error::{ArgumentKind, Error, Result};

/// The most payload bytes [`send_fd`] carries with a descriptor.
pub const MAX_FD_PAYLOAD: usize = 4096;

fn io_error(what: &str, e: io::Error) -> Error {
    Error::invalid_state(crate::error::StateKind::Other, format!("{what}: {e}"))
}

/// Room in a control buffer for one descriptor: `CMSG_SPACE(sizeof(int))` bytes, as
/// `u64`s so that the buffer is aligned for `cmsghdr`.
fn control_for_one_fd() -> Vec<u64> {
    // SAFETY: CMSG_SPACE is a pure computation on its argument.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) } as usize;
    vec![0u64; space.div_ceil(8)]
}

/// A message header over one payload buffer (`iov`) and a control buffer from
/// [`control_for_one_fd`]; it points into both, which must outlive its use.
fn message(iov: &mut libc::iovec, control: &mut [u64]) -> libc::msghdr {
    // SAFETY: an all-zero msghdr is valid (null pointers, zero lengths); filled below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(control) as _;
    msg
}

/// Sends `fd` and `payload` (at most [`MAX_FD_PAYLOAD`] bytes, at least one) over
/// `socket` in one message; the other end gets its own descriptor for the same open
/// file with [`recv_fd`]. `fd` stays the caller's.
pub fn send_fd(socket: &UnixStream, fd: BorrowedFd<'_>, payload: &[u8]) -> Result<()> {
    if payload.is_empty() || payload.len() > MAX_FD_PAYLOAD {
        return Err(Error::invalid_argument(
            ArgumentKind::InvalidValue,
            format!(
                "send_fd: a payload of {} bytes: between 1 and {MAX_FD_PAYLOAD}",
                payload.len()
            ),
        ));
    }
    let raw = fd.as_raw_fd();
    let mut iov = libc::iovec {
        iov_base: payload.as_ptr() as *mut libc::c_void,
        iov_len: payload.len(),
    };
    let mut control = control_for_one_fd();
    let msg = message(&mut iov, &mut control);
    // SAFETY: `msg` points at a control buffer of at least CMSG_SPACE(sizeof(int))
    // bytes, so the first header and its int-sized data lie inside it.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>(), raw);
    }
    // SAFETY: `msg` and everything it points to (the payload, the control buffer)
    // live across the call; the socket is open.
    let n = unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io_error("send_fd: sendmsg", io::Error::last_os_error()));
    }
    if n as usize != payload.len() {
        return Err(io_error(
            "send_fd",
            io::Error::new(io::ErrorKind::WriteZero, "the payload went out in part"),
        ));
    }
    Ok(())
}

/// Receives a descriptor and its payload sent by [`send_fd`]: a descriptor of this
/// process (closed when dropped) and the payload bytes. An error when the message
/// carries no descriptor or the peer closed the socket.
pub fn recv_fd(socket: &UnixStream) -> Result<(OwnedFd, Vec<u8>)> {
    let mut payload = vec![0u8; MAX_FD_PAYLOAD];
    let mut iov = libc::iovec {
        iov_base: payload.as_mut_ptr().cast(),
        iov_len: payload.len(),
    };
    let mut control = control_for_one_fd();
    let mut msg = message(&mut iov, &mut control);
    // SAFETY: `msg` points at live buffers of the lengths it states; MSG_CMSG_CLOEXEC
    // marks the received descriptor close-on-exec.
    let n = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io_error("recv_fd: recvmsg", io::Error::last_os_error()));
    }
    if n == 0 {
        return Err(io_error(
            "recv_fd",
            io::Error::new(io::ErrorKind::UnexpectedEof, "the peer closed the socket"),
        ));
    }
    // SAFETY: after recvmsg, the control buffer holds `msg_controllen` bytes of
    // headers; CMSG_FIRSTHDR returns null when there is none.
    let fd = unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        if c.is_null() || (*c).cmsg_level != libc::SOL_SOCKET || (*c).cmsg_type != libc::SCM_RIGHTS
        {
            None
        } else {
            Some(std::ptr::read_unaligned(
                libc::CMSG_DATA(c).cast::<libc::c_int>(),
            ))
        }
    };
    let Some(fd) = fd else {
        return Err(io_error(
            "recv_fd",
            io::Error::new(
                io::ErrorKind::InvalidData,
                "the message carried no descriptor",
            ),
        ));
    };
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        // SAFETY: the kernel installed `fd` in this process for this message.
        drop(unsafe { OwnedFd::from_raw_fd(fd) });
        return Err(io_error(
            "recv_fd",
            io::Error::new(
                io::ErrorKind::InvalidData,
                "more than one descriptor was sent",
            ),
        ));
    }
    payload.truncate(n as usize);
    // SAFETY: the kernel installed `fd` in this process for this message; nothing
    // else owns it.
    Ok((unsafe { OwnedFd::from_raw_fd(fd) }, payload))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsFd;

    #[test]
    fn a_descriptor_and_its_payload_cross_a_socket() {
        let (a, b) = UnixStream::pair().unwrap();
        let path = std::env::temp_dir().join(format!("cuda-rt-fd-{}", std::process::id()));
        let mut file = std::fs::File::options()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        file.write_all(b"shared through SCM_RIGHTS").unwrap();
        send_fd(&a, file.as_fd(), b"pool 0").unwrap();
        let (fd, payload) = recv_fd(&b).unwrap();
        assert_eq!(payload, b"pool 0");
        assert_ne!(fd.as_raw_fd(), file.as_raw_fd(), "a descriptor of its own");
        let mut got = std::fs::File::from(fd);
        got.rewind().unwrap();
        let mut text = String::new();
        got.read_to_string(&mut text).unwrap();
        assert_eq!(text, "shared through SCM_RIGHTS");
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn bad_payloads_and_messages_without_a_descriptor_are_errors() {
        let (a, b) = UnixStream::pair().unwrap();
        let devnull = std::fs::File::open("/dev/null").unwrap();
        assert!(send_fd(&a, devnull.as_fd(), b"").is_err());
        assert!(send_fd(&a, devnull.as_fd(), &[0; MAX_FD_PAYLOAD + 1]).is_err());
        (&a).write_all(b"plain bytes").unwrap();
        let e = recv_fd(&b).unwrap_err();
        assert!(e.to_string().contains("no descriptor"), "{e}");
        drop(a);
        let e = recv_fd(&b).unwrap_err();
        assert!(e.to_string().contains("closed"), "{e}");
    }
}
