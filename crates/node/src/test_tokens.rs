//! A token resolver for the node's route tests: `reader` may read the agent `n1`; no token
//! is the anonymous token, which may do nothing; any other token is unknown.

use acl::{Authorizer, BoxFuture, ResolveError, Resolved, Token, TokenResolver};
use std::sync::Arc;

pub(crate) struct ReaderTokens;

impl TokenResolver for ReaderTokens {
    fn enabled(&self) -> bool {
        true
    }

    fn resolve(&self, token: Option<&Token>) -> BoxFuture<'_, Result<Resolved, ResolveError>> {
        let rules = match token.map(Token::secret) {
            Some("reader") => acl::Rules::parse(r#"agent "n1" { policy = "read" }"#).unwrap_or_default(),
            None => acl::Rules::default(),
            Some(_) => return Box::pin(std::future::ready(Err(ResolveError::NotFound))),
        };
        Box::pin(std::future::ready(Ok(Resolved {
            accessor: "a1".into(),
            authz: Arc::new(Authorizer::new([&rules], false)),
            expires: None,
        })))
    }

    fn changed(&self) -> BoxFuture<'static, ()> {
        Box::pin(std::future::pending())
    }
}
