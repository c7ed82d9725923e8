//! `kubernetes` logins: the Kubernetes API's TokenReview says whose service account token it
//! is; the service account's annotation may name the service it stands for.

use crate::config::KubernetesConfig;
use crate::identity::LoginError;
use serde_json::{Value, json};
use structs::filter::ServiceAccountIdentity;

/// The annotation that names a service account's Consul service.
const SERVICE_NAME_ANNOTATION: &str = "consul.hashicorp.com/service-name";

pub(crate) async fn verify(
    clients: &crate::fetch::Clients,
    cfg: &KubernetesConfig,
    bearer: &str,
) -> Result<ServiceAccountIdentity, LoginError> {
    let client = clients.get(&cfg.ca).map_err(LoginError::Unavailable)?;
    let review = json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": bearer},
    });
    let url = format!("{}/apis/authentication.k8s.io/v1/tokenreviews", cfg.host);
    let answer = call(client.post(&url).json(&review), &cfg.reviewer_jwt, &url).await?;
    let status = answer.get("status").cloned().unwrap_or(Value::Null);
    if status.get("authenticated").and_then(Value::as_bool) != Some(true) {
        let why = status
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("not authenticated");
        return Err(LoginError::Denied(format!(
            "BearerToken: the Kubernetes API did not accept it: {why}"
        )));
    }
    let user = status.get("user").cloned().unwrap_or(Value::Null);
    let username = user.get("username").and_then(Value::as_str).unwrap_or_default();
    let Some((namespace, name)) = username
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'))
        .filter(|(ns, n)| dns_name(ns) && dns_name(n))
    else {
        return Err(LoginError::Denied(format!(
            "BearerToken: belongs to {username:?}, not a service account"
        )));
    };
    let uid = user.get("uid").and_then(Value::as_str).unwrap_or_default().to_owned();
    let account_url = format!("{}/api/v1/namespaces/{namespace}/serviceaccounts/{name}", cfg.host);
    let account = call(client.get(&account_url), &cfg.reviewer_jwt, &account_url).await?;
    let annotated = account
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(SERVICE_NAME_ANNOTATION))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty());
    Ok(ServiceAccountIdentity {
        namespace: namespace.to_owned(),
        name: annotated.unwrap_or(name).to_owned(),
        uid,
    })
}

/// A Kubernetes object name (lowercase letters, digits, `-` and `.`).
fn dns_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
}

/// One call to the Kubernetes API with the reviewer's token; its JSON answer.
async fn call(req: reqwest::RequestBuilder, reviewer_jwt: &str, url: &str) -> Result<Value, LoginError> {
    let resp = req
        .bearer_auth(reviewer_jwt)
        .send()
        .await
        .map_err(|e| LoginError::Unavailable(format!("the Kubernetes API at {url}: {e}")))?;
    let status = resp.status();
    if !status.is_success() {
        return Err(LoginError::Unavailable(format!(
            "the Kubernetes API at {url} answered HTTP {status}"
        )));
    }
    resp.json()
        .await
        .map_err(|e| LoginError::Unavailable(format!("the Kubernetes API at {url}: not JSON: {e}")))
}
