//! The producer under [`super::KafkaSink`]: librdkafka's `BaseProducer`, whose delivery reports
//! a tokio task serves when librdkafka signals them, instead of a polling thread.
//!
//! # Why not rust-rdkafka's `FutureProducer`
//!
//! `FutureProducer` serves delivery reports on a thread of its own ("producer polling thread")
//! that waits on librdkafka's main queue and completes one future per message, which then wakes
//! the tokio worker whose task awaits it. Each produce request thus costs two thread wake-ups
//! between librdkafka's broker thread and the checkpoint task, and at ordinary rates (1,000
//! single-row commits/s: one produce request per apply group) wake-ups were most of binval's CPU
//! per transaction (issue #24; docs/benchmarks.md, "Delivery reports, linger and workers").
//!
//! librdkafka can instead write to a file descriptor whenever an event lands on its main queue
//! and the queue was served since the last write (`rd_kafka_queue_io_event_enable`, rdkafka.h).
//! Here that descriptor is one end of a Unix socket pair whose other end tokio's reactor watches:
//! the broker thread's write wakes a tokio worker, which serves the reports itself (the delivery
//! callback completes a [`DeliveryFuture`], usually for a task on that same worker). A report
//! missed by the wake-up is still served within [`POLL_FALLBACK`], as the polling thread's
//! 100 ms poll would have.
//!
//! Must be created inside a tokio runtime (it spawns the serving task); dropping the producer
//! stops the task, then (as rust-rdkafka does) purges and flushes what is still queued.

use std::future::Future;
use std::io::ErrorKind;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rdkafka::bindings as rdsys;
use rdkafka::client::{Client, ClientContext};
use rdkafka::config::{ClientConfig, FromClientConfigAndContext, RDKafkaLogLevel};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::{Message, Timestamp, ToBytes};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, FutureRecord, Producer, ProducerContext};
use tokio::sync::oneshot;

use crate::security::kafka::SecurityContext;

/// How long the serving task sleeps at most without a wake-up from librdkafka (the interval
/// rust-rdkafka's polling thread polls at).
pub const POLL_FALLBACK: Duration = Duration::from_millis(100);

/// Where an acknowledged message landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    /// Its partition.
    pub partition: i32,
    /// Its offset in the partition.
    pub offset: i64,
    /// Its timestamp (CreateTime: when binval enqueued it, unless the topic says LogAppendTime).
    pub timestamp: Timestamp,
}

/// What a delivery report says: where the message landed, or why it never will.
pub type Report = Result<Delivery, KafkaError>;

/// The delivery report was never given: the producer went away first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cancelled;

/// The delivery of one message ([`EventProducer::send`]): resolves when librdkafka reports it,
/// with `Err(Cancelled)` when the producer is dropped before.
#[must_use = "a delivery is acknowledged only when awaited"]
pub struct DeliveryFuture(oneshot::Receiver<Report>);

impl Future for DeliveryFuture {
    type Output = Result<Report, Cancelled>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx).map_err(|_| Cancelled)
    }
}

/// The client context: [`SecurityContext`]'s logging and error keeping, and delivery reports
/// handed to their [`DeliveryFuture`].
pub struct ReportContext {
    security: SecurityContext,
}

impl ClientContext for ReportContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        self.security.log(level, fac, log_message)
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.security.error(error, reason)
    }
}

impl ProducerContext for ReportContext {
    type DeliveryOpaque = Box<oneshot::Sender<Report>>;

    fn delivery(&self, result: &DeliveryResult<'_>, tx: Self::DeliveryOpaque) {
        let report = match result {
            Ok(m) => Ok(Delivery { partition: m.partition(), offset: m.offset(), timestamp: m.timestamp() }),
            Err((e, _)) => Err(e.clone()),
        };
        // The receiver may be gone (a tenure that ended): nothing waits for the report.
        let _ = tx.send(report);
    }
}

/// librdkafka's producer with its delivery reports served by a tokio task (module docs).
/// Clones share one producer.
#[derive(Clone)]
pub struct EventProducer {
    inner: Arc<BaseProducer<ReportContext>>,
    _server: Arc<AbortOnDrop>,
}

impl EventProducer {
    /// Create the producer from `cc` with `security` as its context, and start serving its
    /// delivery reports. Errors: librdkafka's (an invalid property), or the socket pair
    /// (`KafkaError::ClientCreation` naming it).
    pub fn create(cc: &ClientConfig, security: SecurityContext) -> KafkaResult<Self> {
        let inner = Arc::new(BaseProducer::from_config_and_context(cc, ReportContext { security })?);
        let wake = Wake::enable(inner.client()).map_err(|e| KafkaError::ClientCreation(format!("delivery report wake-up: {e}")))?;
        let server = tokio::spawn(serve(Server { wake, producer: inner.clone() }));
        Ok(EventProducer { inner, _server: Arc::new(AbortOnDrop(server)) })
    }

    /// Enqueue `rec`; its [`DeliveryFuture`] resolves when the broker acknowledges it (or
    /// librdkafka gives up). Errors as librdkafka's `rd_kafka_producev`: `QueueFull` when
    /// `queue.buffering.max.messages` or `.kbytes` is reached (try again later), or a message
    /// it will never take (too large, unknown partition).
    pub fn send<K, P>(&self, rec: FutureRecord<'_, K, P>) -> Result<DeliveryFuture, KafkaError>
    where
        K: ToBytes + ?Sized,
        P: ToBytes + ?Sized,
    {
        let (tx, rx) = oneshot::channel();
        let base = BaseRecord {
            topic: rec.topic,
            partition: rec.partition,
            payload: rec.payload,
            key: rec.key,
            timestamp: rec.timestamp,
            headers: rec.headers,
            delivery_opaque: Box::new(tx),
        };
        match self.inner.send(base) {
            Ok(()) => Ok(DeliveryFuture(rx)),
            Err((e, _)) => Err(e),
        }
    }

    /// The librdkafka client (metadata requests).
    pub fn client(&self) -> &Client<ReportContext> {
        self.inner.client()
    }

    /// Messages enqueued and not yet reported (`rd_kafka_outq_len`).
    pub fn in_flight_count(&self) -> i32 {
        self.inner.in_flight_count()
    }

    /// Wait (blocking) up to `timeout` for every enqueued message to be reported.
    pub fn flush(&self, timeout: Duration) -> KafkaResult<()> {
        self.inner.flush(timeout)
    }
}

/// Aborts the serving task when the last clone of the producer goes.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// librdkafka's main queue with its IO event on, and the socket tokio watches for it.
struct Wake {
    /// A reference to the main queue (`rd_kafka_queue_get_main`), released on drop.
    queue: *mut rdsys::rd_kafka_queue_t,
    /// The end librdkafka writes to: open as long as the IO event is on (it closes after
    /// [`Drop`] turned the event off).
    _writer: std::os::unix::net::UnixStream,
    /// The end the reactor watches.
    reader: tokio::net::UnixStream,
}

// SAFETY: librdkafka's queues are thread safe (rdkafka.h: every rd_kafka_queue_* call may be made
// from any thread); the pointer is only read (`rd_kafka_queue_length`), and turned off and
// released once, in Drop.
unsafe impl Send for Wake {}
// SAFETY: as above; the serving task shares it only with itself.
unsafe impl Sync for Wake {}

impl Wake {
    fn enable<C: ClientContext>(client: &Client<C>) -> std::io::Result<Wake> {
        let (writer, reader) = std::os::unix::net::UnixStream::pair()?;
        // librdkafka's broker thread writes: it must never block on a full socket.
        writer.set_nonblocking(true)?;
        reader.set_nonblocking(true)?;
        let reader = tokio::net::UnixStream::from_std(reader)?;
        // SAFETY: the client is alive; the queue reference is released in Drop, after the IO
        // event is turned off, and `writer` outlives the IO event (it closes after Drop).
        let queue = unsafe { rdsys::rd_kafka_queue_get_main(client.native_ptr()) };
        if queue.is_null() {
            return Err(std::io::Error::other("librdkafka gave no main queue"));
        }
        let payload = [1u8];
        // SAFETY: `queue` is the reference above; librdkafka copies the payload.
        unsafe { rdsys::rd_kafka_queue_io_event_enable(queue, writer.as_raw_fd(), payload.as_ptr().cast(), payload.len()) };
        Ok(Wake { queue, _writer: writer, reader })
    }

    /// Events waiting on the main queue.
    fn pending(&self) -> usize {
        // SAFETY: the reference is held until Drop.
        unsafe { rdsys::rd_kafka_queue_length(self.queue) }
    }

    /// Read what librdkafka wrote; `false` when the socket closed or failed.
    fn drain(&self) -> bool {
        let mut buf = [0u8; 64];
        loop {
            match self.reader.try_read(&mut buf) {
                Ok(0) => return false,
                Ok(_) => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return false,
            }
        }
    }
}

impl Drop for Wake {
    fn drop(&mut self) {
        // SAFETY: the queue reference is still held; fd -1 turns the IO event off, so librdkafka
        // no longer writes to `writer` (closed after this).
        unsafe {
            rdsys::rd_kafka_queue_io_event_enable(self.queue, -1, std::ptr::null(), 0);
            rdsys::rd_kafka_queue_destroy(self.queue);
        }
    }
}

/// What the serving task owns. Fields drop in order: the IO event is off and the queue
/// reference released before the task's share of the producer goes (which may be the last one,
/// and then destroys the client).
struct Server {
    wake: Wake,
    producer: Arc<BaseProducer<ReportContext>>,
}

/// Serve the main queue whenever librdkafka signals it (or every [`POLL_FALLBACK`]): delivery
/// reports complete their futures, errors reach the context.
async fn serve(server: Server) {
    let Server { wake, producer } = &server;
    loop {
        // Serve what is queued. A poll that takes nothing ends the round, so an entry that poll
        // does not remove cannot make this spin; the fallback serves it later.
        let mut pending = wake.pending();
        while pending > 0 {
            producer.poll(Duration::ZERO);
            let now = wake.pending();
            if now >= pending {
                break;
            }
            pending = now;
        }
        match tokio::time::timeout(POLL_FALLBACK, wake.reader.readable()).await {
            Ok(Ok(())) => {
                if !wake.drain() {
                    return;
                }
            }
            Ok(Err(_)) => return,
            Err(_) => {}
        }
    }
}
