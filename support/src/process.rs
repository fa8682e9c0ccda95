//! What every Agent-Reach binary does the same way at start and stop: build the tokio
//! runtime, set up logging, and wait for ctrl-c or SIGTERM.

/// A runtime with `threads` workers: 1 gives a single-threaded runtime, 0 one per core.
pub fn runtime(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        if threads > 1 {
            b.worker_threads(threads);
        }
        b
    };
    builder.enable_all().build()
}

/// Logs to stderr as "text" or "json"; the level comes from `RUST_LOG` (default `info`).
pub fn init_logging(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    // try_init: a second call (tests, embedding) keeps the first subscriber.
    let _ = if format == "json" { builder.json().try_init() } else { builder.try_init() };
}

/// Completes on ctrl-c or SIGTERM.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Completes once `stop` holds `true` (or its sender is gone). Background loops select on
/// this to end on shutdown.
pub async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    // The guard `wait_for` returns is dropped here, so callers' futures stay `Send`.
    let _ = stop.wait_for(|s| *s).await.map(|_| ());
}
