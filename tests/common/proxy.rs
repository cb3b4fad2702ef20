//! A TCP proxy on 127.0.0.1 that can cut the connections through it: a network partition
//! between the clients that use it and one broker, made in user space (bytes are held, not
//! refused, as a partition drops packets; new connections are accepted and hear nothing).
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub(crate) struct Proxy {
    cut: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Forwards 127.0.0.1:`listen` to 127.0.0.1:`to`.
    pub(crate) async fn start(listen: u16, to: u16) -> Self {
        let listener = TcpListener::bind(("127.0.0.1", listen))
            .await
            .expect("proxy port free");
        let cut = Arc::new(AtomicBool::new(false));
        let c = cut.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(("127.0.0.1", to)).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pipe(cr, sw, c.clone()));
                tokio::spawn(pipe(sr, cw, c.clone()));
            }
        });
        Proxy { cut, task }
    }

    /// Cuts (`true`) or heals (`false`) every connection through the proxy.
    pub(crate) fn cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies `from` to `to`, holding what it read while the proxy is cut.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    cut: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        while cut.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
