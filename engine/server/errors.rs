//! Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, with the HTTP
//! status that goes with each.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`, ...
    pub kind: &'static str,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds, for the `Retry-After` header of a 429.
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// A 400 about the request itself; `param` names the field at fault.
    pub fn invalid(message: impl Into<String>, param: Option<&str>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(Into::into),
            code: None,
            retry_after: None,
        }
    }

    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    pub fn unauthorized() -> ApiError {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "Incorrect or missing API key: send it as `Authorization: Bearer KEY`.".into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("invalid_api_key"),
            retry_after: None,
        }
    }

    /// The queue is full: come back in `retry_after` seconds.
    pub fn queue_full(queued: usize, retry_after: u64) -> ApiError {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: format!(
                "The server is busy: {queued} requests are already waiting (--max-queued). Retry after {retry_after} s."
            ),
            kind: "rate_limit_error",
            param: None,
            code: Some("rate_limit_exceeded"),
            retry_after: Some(retry_after),
        }
    }

    pub fn timeout(secs: f64) -> ApiError {
        ApiError {
            status: StatusCode::REQUEST_TIMEOUT,
            message: format!(
                "The request took longer than the server's limit of {secs} s (--request-timeout)."
            ),
            kind: "timeout_error",
            param: None,
            code: Some("request_timeout"),
            retry_after: None,
        }
    }

    pub fn not_found(path: &str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("No such endpoint: {path}"),
            kind: "invalid_request_error",
            param: None,
            code: Some("not_found"),
            retry_after: None,
        }
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// The JSON body: also sent as the last event of a stream that fails.
    pub fn body(&self) -> Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// A required field that is absent.
pub fn missing(param: &str) -> ApiError {
    ApiError::invalid(
        format!("Missing required parameter: '{param}'."),
        Some(param),
    )
    .with_code("missing_required_parameter")
}

/// A value outside what the field takes.
pub fn out_of_range(param: &str, why: impl std::fmt::Display) -> ApiError {
    ApiError::invalid(format!("Invalid value for '{param}': {why}"), Some(param))
        .with_code("invalid_value")
}

/// A value rustle does not act on.
pub fn unsupported(param: &str, why: &str) -> ApiError {
    ApiError::invalid(format!("'{param}' {why}"), Some(param)).with_code("unsupported_value")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_has_openais_four_fields() {
        let e = ApiError::invalid("top_p must be in (0, 1], got 2", Some("top_p"));
        assert_eq!(
            e.body(),
            json!({"error": {"message": "top_p must be in (0, 1], got 2",
                "type": "invalid_request_error", "param": "top_p", "code": null}})
        );
        let r = ApiError::queue_full(4, 1).into_response();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
    }
}
