//! The app-supplied loader: the last resort of a fill when no suffix replica holds the key.

use std::future::Future;
use std::sync::Arc;

use futures::future::{BoxFuture, FutureExt};

/// What a loader returns: the payload text of the key (the JSON binval would have written),
/// `None` when the row does not exist, or an error message.
pub type LoaderFuture = BoxFuture<'static, Result<Option<String>, String>>;

/// A type-erased loader, cheap to clone.
#[derive(Clone)]
pub(crate) struct LoaderFn(pub Arc<dyn Fn(String) -> LoaderFuture + Send + Sync>);

impl LoaderFn {
    pub(crate) fn new<F, Fut, E>(f: F) -> Self
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Option<String>, E>> + Send + 'static,
        E: std::fmt::Display,
    {
        LoaderFn(Arc::new(move |key| f(key).map(|r| r.map_err(|e| e.to_string())).boxed()))
    }

    pub(crate) fn call(&self, key: &str) -> LoaderFuture {
        (self.0)(key.to_string())
    }
}

impl std::fmt::Debug for LoaderFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LoaderFn(..)")
    }
}
