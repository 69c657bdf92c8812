//! Options of hot-key detection (`hot.rs`: a SpaceSaving top-K sketch over a sliding window).

use std::time::Duration;

use super::ConsumerBuilder;

/// # Hot-key detection
///
/// Whether reads are counted per key ([`ConsumerBuilder::hot_key_detection`]), over which
/// window ([`ConsumerBuilder::hot_key_window`]), at which rate a key is hot
/// ([`ConsumerBuilder::hot_key_threshold`]), the sketch's size and sampling, and how many keys
/// [`Consumer::hot_keys`](crate::Consumer::hot_keys) reports. See "Hot-key detection" in the
/// crate docs.
impl ConsumerBuilder {
    /// Hot-key detection on or off. Default on. It counts (sampled) reads per key in a sliding
    /// window with a SpaceSaving top-K sketch; see "Hot-key detection" in the crate docs,
    /// [`crate::Consumer::hot_keys`] and the `binval_consumer_hot_key*` gauges. Off saves a
    /// few ns per `get`; [`CacheMode::HotOnly`](crate::CacheMode::HotOnly) needs it on.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.hot_key_detection(false);
    /// ```
    pub fn hot_key_detection(mut self, on: bool) -> Self {
        self.hot_key_detection = on;
        self
    }

    /// Length of the sliding window over which read rates are measured. Default 10 s.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.hot_key_window(Duration::from_secs(2));
    /// ```
    pub fn hot_key_window(mut self, window: Duration) -> Self {
        self.hot_key_window = window;
        self
    }

    /// Reads per second (of this instance) at or above which a key is hot: reported as `hot` by
    /// [`crate::Consumer::hot_keys`], and cached in
    /// [`CacheMode::HotOnly`](crate::CacheMode::HotOnly). Compared with the *guaranteed* rate (the
    /// sketch's lower bound), so a cold key is never judged hot by the sketch's over-count. Default
    /// 1000.0.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.hot_key_threshold(200.0);
    /// ```
    pub fn hot_key_threshold(mut self, reads_per_sec: f64) -> Self {
        self.hot_key_threshold = reads_per_sec;
        self
    }

    /// Counters of the SpaceSaving sketch (per window). Default 256. Every key read more than
    /// `1/capacity` of all reads in a window is guaranteed to be tracked.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.hot_key_capacity(1024);
    /// ```
    pub fn hot_key_capacity(mut self, counters: usize) -> Self {
        self.hot_key_capacity = counters;
        self
    }

    /// Count one read of every `n` per thread, weighted by `n`. Default 16 (keeps the counting
    /// cost of a local hit to a few ns); 1 counts every read.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.hot_key_sample_every(1);
    /// ```
    pub fn hot_key_sample_every(mut self, n: u32) -> Self {
        self.hot_key_sample_every = n;
        self
    }

    /// How many keys [`crate::Consumer::hot_keys`] and the per-key gauge report. Default 10.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.hot_key_top_k(20);
    /// ```
    pub fn hot_key_top_k(mut self, k: usize) -> Self {
        self.hot_key_top_k = k;
        self
    }
}
