//! Options of adaptive replica counts (`counts.rs`, `heat.rs`): this instance's heat reports
//! to binval's leader, its instance id, and the hot set it loads.

use std::time::Duration;

use super::ConsumerBuilder;

/// # Adaptive replica counts: heat reports and the hot set
///
/// binval grows the replica count of a key the fleet reads hot and shrinks it when the key
/// cools; readers learn each key's count from the records (see "Adaptive replica counts" in
/// the crate docs). What an instance contributes: its **heat reports**
/// ([`ConsumerBuilder::heat_reports`], every [`ConsumerBuilder::heat_report_interval`], its top
/// [`ConsumerBuilder::heat_report_top_keys`] keys read at least
/// [`ConsumerBuilder::heat_report_min_rate`] times a second, under its
/// [`ConsumerBuilder::instance_id`]); what it reads at start: the **hot set**
/// ([`ConsumerBuilder::hot_set`], refreshed every [`ConsumerBuilder::hot_set_refresh`]).
impl ConsumerBuilder {
    /// Write this instance's heat report every [`ConsumerBuilder::heat_report_interval`]:
    /// `HSET binval:heat:{b} <instance id> <report JSON>`
    /// ([`binval_protocol::adaptive::HeatReport`]: the keys this instance reads most, with
    /// their reads per second, every `get` counted, local hits included), and remove it
    /// (`HDEL`) at [`crate::Consumer::shutdown`]. Default on. binval's leader sums the reports
    /// of the fleet to decide which keys get more suffix replicas; an instance that does not
    /// report still learns the counts from the records, but its reads do not count.
    ///
    /// The Redis ACL user then needs `HSET` and `HDEL` on `binval:heat:*` (sixteen hashes
    /// `binval:heat:{0}`..`binval:heat:{15}`), besides `HMGET` on the replicas and `HGETALL`
    /// on `binval:hot`; e.g. on Redis 7: `ACL SETUSER app on >PASSWORD resetkeys %R~item:*
    /// %R~binval:hot ~binval:heat:* resetchannels -@all +ping +hmget +hgetall +hset +hdel
    /// +cluster|slots`. Without them every report fails with `NOPERM`: logged once, counted
    /// ([`crate::Stats::heat_reports_failed`]), retried every interval, never a failed read.
    ///
    /// The rates come from hot-key detection ([`ConsumerBuilder::hot_key_detection`]); with it
    /// off no report has a key, so none is written (`build()` warns).
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.heat_reports(false); // e.g. a batch job whose reads should not spread keys
    /// ```
    pub fn heat_reports(mut self, on: bool) -> Self {
        self.heat_reports = on;
        self
    }

    /// How often the heat report is written. Default **1 s**, at least 100 ms. binval's leader
    /// spreads a key within about two seconds of its rise with 1 s reports: a report's rates
    /// follow a step within a fifth of a second and a stop within about 4 s (hot-key
    /// detection keeps a 150 ms and a 2 s window for them besides
    /// [`ConsumerBuilder::hot_key_window`]). Longer intervals spread later and
    /// write less (one `HSET` per interval per instance, none while no key is above
    /// [`ConsumerBuilder::heat_report_min_rate`]).
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.heat_report_interval(Duration::from_millis(500));
    /// ```
    pub fn heat_report_interval(mut self, interval: Duration) -> Self {
        self.heat_report_interval = interval;
        self
    }

    /// How many keys one heat report names at most (this instance's most read). Default
    /// **32**, 1 to 1024. Keys below [`ConsumerBuilder::heat_report_min_rate`] are left out
    /// anyway; the hot-key sketch tracks [`ConsumerBuilder::hot_key_capacity`] keys, so a
    /// larger top than that adds nothing.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.heat_report_top_keys(64);
    /// ```
    pub fn heat_report_top_keys(mut self, keys: usize) -> Self {
        self.heat_report_top_keys = keys;
        self
    }

    /// Reads per second of this instance below which a key is not reported. Default
    /// **100.0**; a finite number, at least 0. A key this instance reads more slowly than that
    /// is not worth a line in the report: binval's leader spreads a key only when the fleet's
    /// sum is far above what one master serves.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.heat_report_min_rate(500.0);
    /// ```
    pub fn heat_report_min_rate(mut self, reads_per_sec: f64) -> Self {
        self.heat_report_min_rate = reads_per_sec;
        self
    }

    /// This instance's id: the field of its heat report (the report goes to hash
    /// `binval:heat:{b}`, `b` = [`binval_protocol::adaptive::heat_bucket_of`] the id). Must be
    /// unique in the fleet and non-empty. Default `<hostname>-<pid>-<8 random hex digits>`,
    /// new at every start (the report of an instance that stopped without
    /// [`crate::Consumer::shutdown`] ages out on binval's side). A stable id (e.g. the pod
    /// name) lets a restarted instance overwrite its own report.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.instance_id(std::env::var("POD_NAME").unwrap_or_else(|_| "product-api-0".into()));
    /// ```
    pub fn instance_id(mut self, id: impl Into<String>) -> Self {
        self.instance_id = Some(id.into());
        self
    }

    /// Load the hot set (`HGETALL binval:hot`: logical key -> replica count, for the keys
    /// binval has spread) once in `build()`, so the first reads of a key that is already hot
    /// spread at once. Default on. A failure (the ACL lacks `HGETALL` on `binval:hot`, a
    /// timeout) is a warning naming the key, never a failed `build()`; a bad entry is a
    /// warning naming the key and value, and is skipped. Off also turns off the refreshes
    /// ([`ConsumerBuilder::hot_set_refresh`]).
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.hot_set(false); // the ACL user may not read binval:hot
    /// ```
    pub fn hot_set(mut self, on: bool) -> Self {
        self.hot_set = on;
        self
    }

    /// How often the hot set is loaded again after `build()` (one `HGETALL` per instance per
    /// interval). Default **30 s**; `Duration::ZERO` loads it only at start. The records
    /// correct any count on the next read of a key; the refresh only makes the first reads of
    /// keys that became hot since start spread at once.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.hot_set_refresh(Duration::from_secs(60));
    /// ```
    pub fn hot_set_refresh(mut self, every: Duration) -> Self {
        self.hot_set_refresh = every;
        self
    }
}
