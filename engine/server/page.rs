//! The chat page at `/`: plain HTML, CSS and JavaScript files (in `page/`) compiled into the
//! binary, so `rustle serve` needs no build step, no CDN and no files beside it. The page
//! talks to the server's own API (`/v1/models`, `/v1/chat/completions`) like any other
//! client and keeps its conversations in the browser.
//!
//! The files themselves are open to all, whatever `--api-key` says: they hold no data, and
//! the page asks for the key when the API answers 401.

use axum::Router;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// One file of the page: where it is served, and what it is.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    body: &'static str,
}

const HTML: &str = "text/html; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";

/// The page's files. The scripts are ES modules: app.js imports the other three.
const ASSETS: &[Asset] = &[
    Asset {
        path: "/",
        content_type: HTML,
        body: include_str!("page/index.html"),
    },
    Asset {
        path: "/page/style.css",
        content_type: CSS,
        body: include_str!("page/style.css"),
    },
    Asset {
        path: "/page/app.js",
        content_type: JS,
        body: include_str!("page/app.js"),
    },
    Asset {
        path: "/page/api.js",
        content_type: JS,
        body: include_str!("page/api.js"),
    },
    Asset {
        path: "/page/store.js",
        content_type: JS,
        body: include_str!("page/store.js"),
    },
    Asset {
        path: "/page/markdown.js",
        content_type: JS,
        body: include_str!("page/markdown.js"),
    },
];

/// The page renders the model's text as HTML. Its Markdown renderer escapes everything
/// first; this policy is the second line: only the page's own files may run or style
/// anything, and only the page's own server may be called.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
    style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; \
    form-action 'none'; frame-ancestors 'none'";

/// A route per file, for any router state.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    ASSETS.iter().fold(Router::new(), |router, asset| {
        router.route(asset.path, get(move || async move { serve(asset) }))
    })
}

fn serve(asset: &'static Asset) -> Response {
    (
        [
            (header::CONTENT_TYPE, asset.content_type),
            // Revalidate each time: a new binary must never meet an old script held in the
            // browser's cache.
            (header::CACHE_CONTROL, "no-cache"),
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        asset.body,
    )
        .into_response()
}
