//! ACL auth methods, as Consul's: a login presents a bearer token to an auth method, the
//! method verifies it and says who it belongs to (an [`Identity`]), and the method's
//! binding rules turn that identity into what the new ACL token grants ([`Bindings`]).
//!
//! Two types:
//!
//! - `jwt`: a JSON Web Token verified with the method's own public keys
//!   (`JWTValidationPubKeys`), a JWKS document (`JWKSURL`), or an OpenID provider's
//!   (`OIDCDiscoveryURL`); its issuer, audience and times checked; chosen claims mapped to
//!   `value.<name>` (`ClaimMappings`) and `list.<name>` (`ListClaimMappings`).
//! - `kubernetes`: a service account's token, sent to the Kubernetes API's TokenReview
//!   (`Host`, `CACert`, `ServiceAccountJWT`); the identity is the service account
//!   (`serviceaccount.namespace`, `.name`, `.uid`; the account's
//!   `consul.hashicorp.com/service-name` annotation, when set, is its name).
//!
//! What a method's settings and a rule's selector and bind name mean is checked when they
//! are written ([`check_method`], [`check_rule`]): a login never finds out that a rule
//! could not have worked.

mod bind;
mod config;
mod fetch;
mod identity;
mod jwt;
mod kubernetes;

pub use bind::{Bindings, bind, check_rule};
pub use config::{ConfigError, check_method};
pub use identity::{Identity, LoginError};

use structs::acl::AclAuthMethod;

/// Verifies bearer tokens. Keeps the key sets it fetched (JWKS, OpenID discovery) for a few
/// minutes, shared by every login through the same method settings.
#[derive(Default)]
pub struct Verifier {
    keys: jwt::KeyCache,
    clients: fetch::Clients,
}

impl Verifier {
    /// A verifier with nothing fetched yet.
    pub fn new() -> Self {
        Verifier::default()
    }

    /// Who `bearer` belongs to, by `method`'s settings.
    pub async fn verify(&self, method: &AclAuthMethod, bearer: &str) -> Result<Identity, LoginError> {
        if bearer.is_empty() {
            return Err(LoginError::Denied("BearerToken: missing".into()));
        }
        let settings = config::Settings::parse(method).map_err(|e| LoginError::Unavailable(e.to_string()))?;
        match settings {
            config::Settings::Jwt(cfg) => jwt::verify(&self.keys, &self.clients, &cfg, bearer)
                .await
                .map(Identity::Jwt),
            config::Settings::Kubernetes(cfg) => kubernetes::verify(&self.clients, &cfg, bearer)
                .await
                .map(Identity::ServiceAccount),
        }
    }
}

#[cfg(test)]
mod tests;
