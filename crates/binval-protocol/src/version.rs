//! Version tokens and the evict rule.
//!
//! A version token (`K:ver`) holds the fence position (see [`crate::fence`]) of the newest
//! change applied to `K`, written only after all replicas of `K` hold that change. It is 0
//! (absent) before the first write and only grows.

/// The value of a version token: the [`crate::FencePosition`] of the newest change applied to
/// the key, as a `u64`. `0` means "never written".
pub type Version = u64;

/// The evict rule: an invalidation event carrying version `event_version` evicts a cached entry
/// that was filled at `cached_version` exactly when `cached_version < event_version`.
///
/// An entry filled at the same or a newer version already reflects the change (reads go
/// version token first, then replica, so a cached pair is never "old value, new version").
///
/// ```
/// use binval_protocol::should_evict;
/// assert!(should_evict(3, 4));
/// assert!(!should_evict(4, 4));
/// assert!(!should_evict(5, 4));
/// ```
#[inline]
pub fn should_evict(cached_version: Version, event_version: Version) -> bool {
    cached_version < event_version
}
