//! The files a server's flags name (certificates, keys, CAs), read with errors that name
//! the flag.

use crate::ServerError;
use crate::args::ServerArgs;

/// The file a flag names, read whole; a failure names the flag and the file.
pub(crate) fn read(flag: &str, path: &std::path::Path) -> Result<Vec<u8>, ServerError> {
    std::fs::read(path).map_err(|e| ServerError::Flags(format!("{flag}: cannot read {}: {e}", path.display())))
}

/// This server's certificate and key (`-tls-cert-file`, `-tls-key-file`) as one PEM, the
/// client identity it presents to servers that verify their clients; none without both.
pub(crate) fn own_identity_pem(args: &ServerArgs) -> Result<Option<Vec<u8>>, ServerError> {
    let (Some(cert), Some(key)) = (&args.tls.cert_file, &args.tls.key_file) else {
        return Ok(None);
    };
    let mut pem = read("-tls-cert-file", cert)?;
    pem.push(b'\n');
    pem.extend(read("-tls-key-file", key)?);
    Ok(Some(pem))
}
