//! A TCP forwarder on a loopback port whose target can be moved: what a DNS name or a virtual
//! IP in front of a primary does in a failover. [`Forwarder::point_to`] moves it and cuts the
//! open connections, as a failover cuts them.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// Forwards `127.0.0.1:port` to `127.0.0.1:<target>`; stops when dropped.
pub struct Forwarder {
    /// The port to connect to.
    pub port: u16,
    target: Arc<AtomicU16>,
    open: Arc<Mutex<Vec<TcpStream>>>,
    stop: Arc<AtomicBool>,
}

impl Forwarder {
    /// Listen on a free loopback port, forwarding to `target`.
    pub fn start(target: u16) -> anyhow::Result<Forwarder> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let f = Forwarder {
            port: listener.local_addr()?.port(),
            target: Arc::new(AtomicU16::new(target)),
            open: Arc::new(Mutex::new(Vec::new())),
            stop: Arc::new(AtomicBool::new(false)),
        };
        let (target, open, stop) = (f.target.clone(), f.open.clone(), f.stop.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let _ = client.set_nonblocking(false);
                        let Ok(server) = TcpStream::connect(("127.0.0.1", target.load(Ordering::Relaxed))) else {
                            let _ = client.shutdown(Shutdown::Both);
                            continue;
                        };
                        if let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) {
                            open.lock().unwrap().extend([c2, s2]);
                        }
                        pipe(client.try_clone().ok(), server.try_clone().ok());
                        pipe(server.try_clone().ok(), client.try_clone().ok());
                    }
                    Err(_) => thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Ok(f)
    }

    /// Forward new connections to `target` from now on and cut every open one.
    pub fn point_to(&self, target: u16) {
        self.target.store(target, Ordering::Relaxed);
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// Copy bytes from `from` to `to` on a thread of its own until either side closes.
fn pipe(from: Option<TcpStream>, to: Option<TcpStream>) {
    let (Some(mut from), Some(mut to)) = (from, to) else { return };
    thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}
