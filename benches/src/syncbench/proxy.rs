//! A byte-counting proxy: accepts connections on its own socket, connects each to the
//! server, and copies both directions on two threads, counting every byte it forwards.
//! What it counts is what a network would carry: the Cap'n Proto messages with their
//! segment tables, nothing added, nothing compressed.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use computer_sync::Address;

/// Bytes forwarded so far, over every connection.
#[derive(Debug, Default)]
pub struct Counters {
    /// Client to server.
    pub up: AtomicU64,
    /// Server to client.
    pub down: AtomicU64,
    opened: AtomicU64,
    /// Connections whose both directions have ended.
    closed: AtomicU64,
}

impl Counters {
    /// (up, down) now.
    pub fn snapshot(&self) -> (u64, u64) {
        (
            self.up.load(Ordering::SeqCst),
            self.down.load(Ordering::SeqCst),
        )
    }

    /// Waits until every connection accepted so far has ended both ways (so every byte
    /// of it is counted).
    pub fn wait_closed(&self, timeout: Duration) -> Result<()> {
        let until = Instant::now() + timeout;
        while self.closed.load(Ordering::SeqCst) < self.opened.load(Ordering::SeqCst) {
            if Instant::now() > until {
                bail!("a proxied connection did not close within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }
}

enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
        })
    }

    fn shutdown(&self, how: Shutdown) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(how),
            Stream::Tcp(s) => s.shutdown(how),
        };
    }

    fn connect(address: &Address) -> io::Result<Stream> {
        Ok(match address {
            Address::Unix(path) => Stream::Unix(UnixStream::connect(path)?),
            Address::Tcp(host_port) => {
                let stream = TcpStream::connect(host_port.as_str())?;
                // As the RPC transport does: no Nagle delay on small calls.
                stream.set_nodelay(true)?;
                Stream::Tcp(stream)
            }
        })
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

enum Listener {
    Unix(UnixListener, PathBuf),
    Tcp(TcpListener),
}

impl Listener {
    fn accept(&self) -> io::Result<Stream> {
        Ok(match self {
            Listener::Unix(l, _) => Stream::Unix(l.accept()?.0),
            Listener::Tcp(l) => {
                let stream = l.accept()?.0;
                stream.set_nodelay(true)?;
                Stream::Tcp(stream)
            }
        })
    }
}

/// The proxy; stops accepting when dropped.
pub struct Proxy {
    address: Address,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Listens on a new socket like `server`'s (a Unix socket `unix_path`, or TCP on
    /// loopback port 0) and forwards to `server`.
    pub fn start(server: &Address, unix_path: &Path) -> Result<Proxy> {
        let listener = match server {
            Address::Unix(_) => Listener::Unix(
                UnixListener::bind(unix_path)
                    .with_context(|| format!("binding {}", unix_path.display()))?,
                unix_path.to_owned(),
            ),
            Address::Tcp(_) => Listener::Tcp(TcpListener::bind("127.0.0.1:0")?),
        };
        let address = match &listener {
            Listener::Unix(_, path) => Address::Unix(path.clone()),
            Listener::Tcp(l) => Address::Tcp(l.local_addr()?.to_string()),
        };
        let counters = Arc::new(Counters::default());
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new()
            .name("proxy-accept".into())
            .spawn({
                let server = server.clone();
                let counters = counters.clone();
                let stop = stop.clone();
                move || accept_loop(listener, server, counters, stop)
            })?;
        Ok(Proxy {
            address,
            counters,
            stop,
            thread: Some(thread),
        })
    }

    /// Where clients connect.
    pub fn address(&self) -> &Address {
        &self.address
    }

    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = Stream::connect(&self.address);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn accept_loop(
    listener: Listener,
    server: Address,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
) {
    loop {
        let client = listener.accept();
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let client = match client {
            Ok(client) => client,
            Err(error) => {
                eprintln!("syncbench: proxy: accept failed: {error}");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        if let Err(error) = relay(client, &server, &counters) {
            eprintln!("syncbench: proxy: {error:#}");
        }
    }
}

/// Starts the two copying threads of one connection.
fn relay(client: Stream, server: &Address, counters: &Arc<Counters>) -> Result<()> {
    let upstream = Stream::connect(server).with_context(|| format!("connecting to {server}"))?;
    counters.opened.fetch_add(1, Ordering::SeqCst);
    let done = Arc::new(AtomicU64::new(0));
    let pairs = [
        (client.try_clone()?, upstream.try_clone()?, true),
        (upstream, client, false),
    ];
    for (from, to, up) in pairs {
        let counters = counters.clone();
        let done = done.clone();
        std::thread::Builder::new()
            .name(if up { "proxy-up" } else { "proxy-down" }.into())
            .spawn(move || {
                copy(from, to, if up { &counters.up } else { &counters.down });
                if done.fetch_add(1, Ordering::SeqCst) == 1 {
                    counters.closed.fetch_add(1, Ordering::SeqCst);
                }
            })?;
    }
    Ok(())
}

/// Copies until EOF or an error, counting each chunk before it is forwarded (so a peer
/// that has received bytes finds them counted), then passes the EOF on.
fn copy(mut from: Stream, mut to: Stream, count: &AtomicU64) {
    let mut buf = vec![0u8; 256 << 10];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        count.fetch_add(n as u64, Ordering::SeqCst);
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    to.shutdown(Shutdown::Write);
    from.shutdown(Shutdown::Read);
}
