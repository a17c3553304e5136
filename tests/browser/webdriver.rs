//! As much of a W3C WebDriver client as the browser tests use: chromedriver on a free
//! port, one headless Chromium session, and the commands to open a page, find, click and
//! type into elements, run a script, reload, and take a screenshot. WebDriver is JSON over
//! HTTP (https://www.w3.org/TR/webdriver2/), so a few lines over reqwest do it. The tests
//! read as a person uses the page, one step after another, so each command blocks: reqwest's
//! future run to its end on a runtime of the test's own thread.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::{Client, Method};
use serde_json::{Value, json};
use tokio::runtime::Runtime;

/// The key under which WebDriver returns an element's handle.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// The programs a session needs.
#[derive(Clone, Debug)]
pub struct Tools {
    chromedriver: PathBuf,
    chromium: PathBuf,
}

impl Tools {
    /// chromedriver and Chromium from PATH (Debian's `chromium-driver` and `chromium`), or
    /// why they cannot be had.
    pub fn find() -> Result<Tools, String> {
        let install = "install Debian's chromium and chromium-driver (.ci/run does)";
        let chromedriver = on_path(&["chromedriver"])
            .ok_or_else(|| format!("no chromedriver on PATH: {install}"))?;
        let chromium = on_path(&["chromium", "chromium-browser", "google-chrome"])
            .ok_or_else(|| format!("no chromium on PATH: {install}"))?;
        Ok(Tools {
            chromedriver,
            chromium,
        })
    }
}

/// The first of `names` found in a folder of PATH.
fn on_path(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    names.iter().find_map(|name| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}

/// One headless Chromium session, driven through its own chromedriver; both end when
/// dropped.
pub struct Browser {
    runtime: Runtime,
    http: Client,
    /// `http://127.0.0.1:PORT/session/ID`, the prefix of every command.
    session: String,
    /// chromedriver, leader of a process group that Chromium joins.
    driver: Child,
}

impl Browser {
    /// Starts chromedriver and a session of `width` x `height` CSS pixels.
    pub fn start(tools: &Tools, width: u32, height: u32) -> Browser {
        let port = free_port();
        let driver = Command::new(&tools.chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own group: Chromium outlives a killed chromedriver, but not its group.
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", tools.chromedriver.display()));
        let runtime = current_thread();
        // reqwest's client wants the runtime it will run on.
        let http = runtime.block_on(async {
            Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap()
        });
        let base = format!("http://127.0.0.1:{port}");
        let mut browser = Browser {
            runtime,
            http,
            session: String::new(),
            driver,
        };
        let started = Instant::now();
        while !browser.ready(&base) {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "chromedriver did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": resolve(&tools.chromium),
                // --no-sandbox: CI runs as root, where Chromium's sandbox will not start.
                "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                    "--disable-gpu", format!("--window-size={width},{height}")],
            },
        }}});
        let value = browser.call(Method::POST, &format!("{base}/session"), capabilities);
        let id = value["sessionId"].as_str().expect("a session id");
        browser.session = format!("{base}/session/{id}");
        browser
    }

    fn ready(&self, base: &str) -> bool {
        let status = async {
            let r = self.http.get(format!("{base}/status")).send().await?;
            r.json::<Value>().await
        };
        self.runtime
            .block_on(status)
            .is_ok_and(|v| v["value"]["ready"] == true)
    }

    /// Sends a command; its `value`, or a panic with WebDriver's error.
    fn call(&self, method: Method, url: &str, body: Value) -> Value {
        let mut request = self.http.request(method.clone(), url);
        if method != Method::GET && method != Method::DELETE {
            request = request.json(&body);
        }
        let reply = self.runtime.block_on(async {
            let response = request.send().await?;
            let status = response.status();
            Ok::<_, reqwest::Error>((status, response.json::<Value>().await?))
        });
        let (status, reply) = reply.unwrap_or_else(|e| panic!("{method} {url}: {e}"));
        assert!(status.is_success(), "{method} {url}: {status} {reply}");
        reply["value"].clone()
    }

    fn command(&self, method: Method, path: &str, body: Value) -> Value {
        self.call(method, &format!("{}{path}", self.session), body)
    }

    pub fn goto(&self, url: &str) {
        self.command(Method::POST, "/url", json!({"url": url}));
    }

    pub fn refresh(&self) {
        self.command(Method::POST, "/refresh", json!({}));
    }

    /// The handle of the first element matching CSS `selector`.
    fn find(&self, selector: &str) -> String {
        let body = json!({"using": "css selector", "value": selector});
        let found = self.command(Method::POST, "/element", body);
        found[ELEMENT].as_str().unwrap().to_owned()
    }

    pub fn click(&self, selector: &str) {
        let id = self.find(selector);
        self.command(Method::POST, &format!("/element/{id}/click"), json!({}));
    }

    /// Clears the field, then types `text` into it, key by key.
    pub fn type_into(&self, selector: &str, text: &str) {
        let id = self.find(selector);
        self.command(Method::POST, &format!("/element/{id}/clear"), json!({}));
        if !text.is_empty() {
            let keys = json!({"text": text});
            self.command(Method::POST, &format!("/element/{id}/value"), keys);
        }
    }

    /// Whether the element is shown (not hidden, not in a closed dialog).
    pub fn displayed(&self, selector: &str) -> bool {
        let id = self.find(selector);
        self.command(Method::GET, &format!("/element/{id}/displayed"), json!({})) == true
    }

    /// Runs `script` (a function body; `arguments` holds `args`) in the page; what it
    /// returns.
    pub fn run(&self, script: &str, args: Value) -> Value {
        let body = json!({"script": script, "args": args});
        self.command(Method::POST, "/execute/sync", body)
    }

    /// Like `run`, for a script that finishes by calling its last argument.
    pub fn run_async(&self, script: &str, args: Value) -> Value {
        let body = json!({"script": script, "args": args});
        self.command(Method::POST, "/execute/async", body)
    }

    /// The viewport as PNG bytes.
    pub fn screenshot(&self) -> Vec<u8> {
        let text = self.command(Method::GET, "/screenshot", json!({}));
        let png = base64_decode(text.as_str().expect("base64 text"));
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
        png
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            // Closing the session quits Chromium; the group's kill covers a failed close.
            let close = async { self.http.delete(&self.session).send().await };
            let _ = self.runtime.block_on(close);
        }
        let group = format!("-{}", self.driver.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.driver.wait();
    }
}

/// A runtime on the calling thread, for one blocking request after another.
pub fn current_thread() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// A port nothing listens on now (the OS's pick, released for chromedriver to take).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The program behind a link (chromedriver wants the real file).
fn resolve(path: &Path) -> String {
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
    real.to_string_lossy().into_owned()
}

/// Standard base64 (with padding), as WebDriver sends screenshots.
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => (c - b'A') as u32,
            b'a'..=b'z' => (c - b'a') as u32 + 26,
            b'0'..=b'9' => (c - b'0') as u32 + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {:?}", c as char),
        }
    };
    let digits: Vec<u8> = text.bytes().filter(|&c| c != b'=').collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for group in digits.chunks(4) {
        // Each digit is 6 bits; a group of n digits holds n - 1 whole bytes.
        let bits = group
            .iter()
            .enumerate()
            .fold(0, |acc, (i, &c)| acc | value(c) << (18 - 6 * i));
        out.extend(&bits.to_be_bytes()[1..group.len()]);
    }
    out
}
