//! A headless Chromium for the dashboard tests, driven over WebDriver: a `chromedriver`
//! process on a free port (Debian packages `chromium` and `chromium-driver`, installed by
//! `scripts/install-chromium.sh`) and a `fantoccini` session on it, with a fresh profile.
//!
//! When chromedriver or chromium is missing the test fails with what to install; it never
//! skips.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::wd::WebDriverCompatibleCommand;
use fantoccini::{Client, ClientBuilder};
use serde_json::{Value, json};

/// A chromedriver process and one browser session on it. Dropping it ends both.
pub struct Browser {
    pub client: Client,
    driver: Child,
    _profile: tempfile::TempDir,
}

fn find(names: &[&str]) -> Option<String> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |n| dir.join(n)))
        .find(|p| p.is_file())
        .map(|p| p.display().to_string())
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session (1400×900).
    pub async fn start() -> Browser {
        let driver_bin = std::env::var("AGENT_REACH_CHROMEDRIVER")
            .ok()
            .or_else(|| find(&["chromedriver"]))
            .expect("chromedriver is required for the dashboard tests: run scripts/install-chromium.sh");
        let chromium = std::env::var("AGENT_REACH_CHROMIUM")
            .ok()
            .or_else(|| find(&["chromium", "chromium-browser", "google-chrome"]))
            .expect("chromium is required for the dashboard tests: run scripts/install-chromium.sh");
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port();
        // Its own process group, so that Chromium, its child, goes with it on drop.
        let driver = Command::new(&driver_bin)
            .process_group(0)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {driver_bin}: {e}"));
        let profile = tempfile::tempdir().expect("browser profile dir");
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": chromium,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    "--disable-dev-shm-usage", "--disable-crash-reporter", "--disable-breakpad",
                    "--window-size=1400,900",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            }),
        );
        caps.insert("goog:loggingPrefs".into(), json!({ "browser": "ALL" }));
        let url = format!("http://127.0.0.1:{port}");
        let mut browser = None;
        let mut last_error = String::new();
        // chromedriver takes a moment to listen.
        for _ in 0..100 {
            match ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
                .capabilities(caps.clone())
                .connect(&url)
                .await
            {
                Ok(client) => {
                    browser = Some(client);
                    break;
                }
                Err(e) => last_error = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let client =
            browser.unwrap_or_else(|| panic!("no WebDriver session on {driver_bin} ({chromium}): {last_error}"));
        Browser { client, driver, _profile: profile }
    }

    /// The browser's console messages since the last call (chromedriver's log).
    pub async fn console(&self) -> Vec<(String, String)> {
        let entries = self.client.issue_cmd(BrowserLog).await.expect("browser log");
        entries
            .as_array()
            .map(|list| {
                list.iter()
                    .map(|e| {
                        let field = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
                        (field("level"), field("message"))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every resource the page loaded (its document included), with its HTTP status.
    pub async fn requests(&self) -> Vec<(String, u64)> {
        let script = "return performance.getEntriesByType('navigation').concat(performance.getEntriesByType('resource'))\
                      .map(e => [e.name, e.responseStatus]);";
        let value = self.client.execute(script, vec![]).await.expect("performance entries");
        value
            .as_array()
            .map(|list| {
                list.iter()
                    .map(|e| (e[0].as_str().unwrap_or_default().to_string(), e[1].as_u64().unwrap_or_default()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Polls `probe` (a script returning a value) until `ready` accepts it, for up to
    /// `timeout`; panics with the last value otherwise.
    pub async fn wait_until(
        &self,
        what: &str,
        timeout: Duration,
        script: &str,
        ready: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let value = self.client.execute(script, vec![]).await.expect("script runs");
            if ready(&value) {
                return value;
            }
            if tokio::time::Instant::now() >= deadline {
                let console = self.console().await;
                panic!("{what}: not within {timeout:?}; last value {value}; console: {console:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Ends the session (Chromium exits) and chromedriver.
    pub async fn close(self) {
        let _ = self.client.clone().close().await;
    }

    /// Writes a PNG of the window to `path`.
    pub async fn screenshot(&self, path: &std::path::Path) {
        let png = self.client.screenshot().await.expect("screenshot");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("screenshot dir");
        }
        std::fs::write(path, png).expect("write screenshot");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The whole group: chromedriver and the Chromium processes it started (a failed
        // test never reaches `close`).
        let group = format!("-{}", self.driver.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.driver.wait();
    }
}

/// chromedriver's console log of the session.
#[derive(Debug)]
struct BrowserLog;

impl WebDriverCompatibleCommand for BrowserLog {
    fn endpoint(&self, base_url: &url::Url, session_id: Option<&str>) -> Result<url::Url, url::ParseError> {
        base_url.join(&format!("session/{}/se/log", session_id.unwrap_or_default()))
    }

    fn method_and_body(&self, _request_url: &url::Url) -> (http::Method, Option<String>) {
        (http::Method::POST, Some(json!({ "type": "browser" }).to_string()))
    }
}
