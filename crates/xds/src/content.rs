//! A resource and its content version (the hex of the first 128 bits of the SHA-256 of its
//! encoding): the unit the protocol states diff and the shared encodings intern.

use envoy_types::pb::google::protobuf::Any;
use sha2::{Digest, Sha256};

/// One resource and the hash of its encoding.
#[derive(Debug, Clone, PartialEq)]
pub struct Versioned {
    /// The first 128 bits of the SHA-256 of the encoded resource, in hex (32 characters):
    /// equal content, equal version. 128 bits keep collisions out of reach (a version is only
    /// ever compared with the previous versions of the same resource) at half the bytes of
    /// the full digest in every delta response, every stream's record of what its proxy
    /// holds, and every CSDS row.
    pub version: String,
    /// The same 128 bits as bytes: what streams compare and record (no string to compare,
    /// no hex to decode).
    pub(crate) digest: [u8; 16],
    /// The encoded resource.
    pub resource: Any,
}

/// SHA-256 of a resource's encoding.
pub(crate) fn digest_of(any: &Any) -> [u8; 32] {
    Sha256::digest(&any.value).into()
}

impl Versioned {
    /// A resource with its content version.
    pub fn new(resource: Any) -> Self {
        let digest = digest_of(&resource);
        Self::with_digest(resource, &digest)
    }

    /// A resource whose encoding hashes to `digest`.
    pub(crate) fn with_digest(resource: Any, digest: &[u8; 32]) -> Self {
        let mut short = [0u8; 16];
        short.copy_from_slice(&digest[..16]);
        Self {
            // `hex::encode` collects an exact-size iterator: one allocation of the final
            // length, as the hand-written encoder it replaced did.
            version: hex::encode(short),
            digest: short,
            resource,
        }
    }
}
