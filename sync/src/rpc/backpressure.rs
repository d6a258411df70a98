//! The server reads a connection only while its answers go out. capnp-rpc queues every
//! answer it has to write, with no bound: a peer that sends calls and never reads the
//! answers would grow that queue for as long as it sends. Here the two halves of the
//! connection share one flag: a write or flush that the socket cannot take now (the
//! peer is not reading) stops the reading half until a write goes through again, so a
//! peer that stops reading stops being read, and what waits to be written is what the
//! calls read before that produced.
//!
//! A peer whose own reading does not wait on its writes (capnp-rpc reads in a task of
//! its own) never sees this: its answers always drain.

use std::cell::{Cell, RefCell};
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use futures::io::{AsyncRead, AsyncWrite};

use super::{Reader, Writer};

/// The two halves of a server's connection, the reading one held while the writing one
/// cannot write.
pub(crate) fn read_while_answers_flow(reader: Reader, writer: Writer) -> (Reader, Writer) {
    let flow = Rc::new(Flow::default());
    (
        Box::new(HeldReader {
            inner: reader,
            flow: flow.clone(),
        }),
        Box::new(WatchedWriter {
            inner: writer,
            flow,
        }),
    )
}

/// Whether the writing half is stuck, and who waits for it not to be.
#[derive(Default)]
struct Flow {
    blocked: Cell<bool>,
    reader: RefCell<Option<Waker>>,
}

impl Flow {
    /// Notes how a write or flush went: pending blocks the reader, anything else lets it
    /// go on.
    fn saw<T>(&self, polled: &Poll<T>) {
        match polled {
            Poll::Pending => self.blocked.set(true),
            Poll::Ready(_) if self.blocked.replace(false) => {
                if let Some(reader) = self.reader.borrow_mut().take() {
                    reader.wake();
                }
            }
            Poll::Ready(_) => {}
        }
    }
}

struct HeldReader {
    inner: Reader,
    flow: Rc<Flow>,
}

impl AsyncRead for HeldReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        if self.flow.blocked.get() {
            *self.flow.reader.borrow_mut() = Some(cx.waker().clone());
            return Poll::Pending;
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

struct WatchedWriter {
    inner: Writer,
    flow: Rc<Flow>,
}

impl AsyncWrite for WatchedWriter {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.flow.saw(&polled);
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.flow.saw(&polled);
        polled
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_close(cx);
        // Closed, nothing more waits to be written: reading may end the connection too.
        self.flow.saw(&polled);
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A socket half whose writes the test lets through or not.
    struct Gate(Rc<Cell<bool>>);

    impl AsyncWrite for Gate {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            if self.0.get() {
                Poll::Ready(Ok(buf.len()))
            } else {
                Poll::Pending
            }
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            if self.0.get() {
                Poll::Ready(Ok(()))
            } else {
                Poll::Pending
            }
        }
        fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    struct CountingWaker(AtomicUsize);

    impl std::task::Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn reading_waits_while_a_write_cannot_go_out() {
        let open = Rc::new(Cell::new(true));
        let incoming: Reader = Box::new(futures::io::Cursor::new(vec![7u8; 64]));
        let (mut reader, mut writer) =
            read_while_answers_flow(incoming, Box::new(Gate(open.clone())));
        let woken = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let waker = Waker::from(woken.clone());
        let mut cx = Context::from_waker(&waker);
        let mut buf = [0u8; 8];
        assert!(matches!(
            Pin::new(&mut reader).poll_read(&mut cx, &mut buf),
            Poll::Ready(Ok(8))
        ));

        // The peer stops reading: the answer cannot go out, and its calls are not read.
        open.set(false);
        assert!(Pin::new(&mut writer).poll_flush(&mut cx).is_pending());
        assert!(Pin::new(&mut reader)
            .poll_read(&mut cx, &mut buf)
            .is_pending());
        assert!(Pin::new(&mut writer)
            .poll_write(&mut cx, b"answer")
            .is_pending());
        assert!(Pin::new(&mut reader)
            .poll_read(&mut cx, &mut buf)
            .is_pending());
        assert_eq!(woken.0.load(Ordering::SeqCst), 0);

        // It reads again: the write goes out, and the reader is woken and reads.
        open.set(true);
        assert!(matches!(
            Pin::new(&mut writer).poll_write(&mut cx, b"answer"),
            Poll::Ready(Ok(6))
        ));
        assert_eq!(woken.0.load(Ordering::SeqCst), 1);
        assert!(matches!(
            Pin::new(&mut reader).poll_read(&mut cx, &mut buf),
            Poll::Ready(Ok(8))
        ));
    }
}
