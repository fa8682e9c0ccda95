//! What every Agent-Reach binary does the same way at start and stop: build the tokio
//! runtime, set up logging, and wait for ctrl-c or SIGTERM.

/// A runtime with `threads` workers: 1 gives a single-threaded runtime, 0 one per core
/// the process may use (a CPU limit counts), and so a single-threaded runtime on one core:
/// there a multi-thread runtime would only add its work-stealing machinery.
pub fn runtime(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    let threads = match threads {
        0 => std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
        n => n,
    };
    let mut builder = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads);
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

#[cfg(test)]
mod runtime_tests {
    use tokio::runtime::RuntimeFlavor;

    #[test]
    fn one_thread_is_a_single_threaded_runtime_and_zero_follows_the_cores() {
        assert_eq!(super::runtime(1).unwrap().handle().runtime_flavor(), RuntimeFlavor::CurrentThread);
        let two = super::runtime(2).unwrap();
        assert_eq!(two.handle().runtime_flavor(), RuntimeFlavor::MultiThread);
        assert_eq!(two.metrics().num_workers(), 2);
        let cores = std::thread::available_parallelism().unwrap().get();
        let auto = super::runtime(0).unwrap();
        if cores == 1 {
            assert_eq!(auto.handle().runtime_flavor(), RuntimeFlavor::CurrentThread);
        } else {
            assert_eq!(auto.handle().runtime_flavor(), RuntimeFlavor::MultiThread);
            assert_eq!(auto.metrics().num_workers(), cores);
        }
    }
}
