//! TLS for the listeners (rustls, ring): the certificate and key, optional
//! client certificates, and reloading both without a restart.
//!
//! A [`Reloading`] holds the current server configuration. Every new
//! connection takes the configuration current when it is accepted; open
//! connections keep theirs. [`watch`] reloads on SIGHUP and whenever a
//! file's modification time or size changes (checked every few seconds).
//! A file that does not load (half written, a key that does not fit the
//! certificate) is logged and the old configuration stays.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use anyhow::Context;
use tokio_rustls::rustls;

/// Whether clients present certificates (Kafka's `ssl.client.auth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    None,
    /// Asked for; a client without one connects as `User:ANONYMOUS`.
    Requested,
    Required,
}

impl std::str::FromStr for ClientAuth {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(ClientAuth::None),
            "requested" => Ok(ClientAuth::Requested),
            "required" => Ok(ClientAuth::Required),
            _ => Err(format!("{s:?} is not none, requested or required")),
        }
    }
}

/// The files a TLS configuration is made from.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_auth: ClientAuth,
    /// Certificates that client certificates must chain to.
    pub client_ca: Option<PathBuf>,
    pub alpn: Vec<Vec<u8>>,
}

fn certificates(path: &Path) -> anyhow::Result<Vec<rustls_pki_types::CertificateDer<'static>>> {
    use rustls_pki_types::pem::PemObject;
    let certs = rustls_pki_types::CertificateDer::pem_file_iter(path)
        .with_context(|| format!("reading {}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parsing the certificates in {}", path.display()))?;
    anyhow::ensure!(!certs.is_empty(), "{} holds no certificate", path.display());
    Ok(certs)
}

/// Loads the files into a server configuration.
pub fn server_config(files: &TlsFiles) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    use rustls_pki_types::pem::PemObject;
    let certs = certificates(&files.cert)?;
    let key = rustls_pki_types::PrivateKeyDer::from_pem_file(&files.key).with_context(|| format!("reading the private key in {}", files.key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions().context("TLS protocol versions")?;
    let builder = match files.client_auth {
        ClientAuth::None => builder.with_no_client_auth(),
        auth => {
            let ca = files.client_ca.as_ref().context("client certificates need a CA file (ssl_ca_file)")?;
            let mut roots = rustls::RootCertStore::empty();
            for c in certificates(ca)? {
                roots.add(c).with_context(|| format!("a certificate in {} is not a usable CA", ca.display()))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = if auth == ClientAuth::Requested { verifier.allow_unauthenticated() } else { verifier };
            builder.with_client_cert_verifier(verifier.build().context("the client certificate verifier")?)
        }
    };
    let mut cfg = builder.with_single_cert(certs, key).context("the TLS certificate and key do not fit together")?;
    cfg.alpn_protocols = files.alpn.clone();
    Ok(Arc::new(cfg))
}

/// What a node presents to, and checks of, another node when it connects
/// to its inter-broker listener: its own certificate and key (those its
/// listeners serve, as a Kafka broker's keystore serves both sides) and
/// the CA the other's certificate must chain to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

/// Loads the files into a client configuration that presents this node's
/// certificate and trusts only `ca`. Blocking (reads the files), so a
/// connection made after the files change takes the new ones.
pub fn client_config(files: &PeerFiles) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    use rustls_pki_types::pem::PemObject;
    let certs = certificates(&files.cert)?;
    let key = rustls_pki_types::PrivateKeyDer::from_pem_file(&files.key).with_context(|| format!("reading the private key in {}", files.key.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    for c in certificates(&files.ca)? {
        roots.add(c).with_context(|| format!("a certificate in {} is not a usable CA", files.ca.display()))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, key)
        .context("the TLS certificate and key do not fit together")?;
    Ok(Arc::new(cfg))
}

/// A server configuration that can be replaced while the listener runs.
pub struct Reloading {
    files: TlsFiles,
    current: RwLock<Arc<rustls::ServerConfig>>,
    /// The files' (modification time, length) when last loaded.
    stamp: Mutex<Vec<Option<(SystemTime, u64)>>>,
    /// Successful reloads, for the test and the log.
    pub reloads: std::sync::atomic::AtomicU64,
}

impl Reloading {
    pub fn load(files: TlsFiles) -> anyhow::Result<Arc<Reloading>> {
        let stamp = Mutex::new(Reloading::stamps(&files));
        let cfg = server_config(&files)?;
        Ok(Arc::new(Reloading { files, current: RwLock::new(cfg), stamp, reloads: Default::default() }))
    }

    fn stamps(files: &TlsFiles) -> Vec<Option<(SystemTime, u64)>> {
        [Some(&files.cert), Some(&files.key), files.client_ca.as_ref()]
            .into_iter()
            .flatten()
            .map(|p| std::fs::metadata(p).ok().and_then(|m| Some((m.modified().ok()?, m.len()))))
            .collect()
    }

    pub fn current(&self) -> Arc<rustls::ServerConfig> {
        self.current.read().expect("tls config lock").clone()
    }

    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.current())
    }

    /// Reloads if a file changed (or always, when `force`). Blocking.
    pub fn reload(&self, force: bool) -> anyhow::Result<bool> {
        let now = Reloading::stamps(&self.files);
        let mut stamp = self.stamp.lock().expect("tls stamp lock");
        if !force && *stamp == now {
            return Ok(false);
        }
        let cfg = server_config(&self.files)?;
        *self.current.write().expect("tls config lock") = cfg;
        *stamp = now;
        self.reloads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(true)
    }
}

/// Reloads every configuration on SIGHUP and when its files change,
/// until `stop`.
pub async fn watch(configs: Vec<Arc<Reloading>>, every: Duration, mut stop: tokio::sync::watch::Receiver<bool>) {
    if configs.is_empty() {
        return;
    }
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    loop {
        let force = tokio::select! {
            _ = tick.tick() => false,
            Some(()) = async { match hup.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => true,
            _ = stop.changed() => return,
        };
        for c in &configs {
            let c2 = c.clone();
            match tokio::task::spawn_blocking(move || c2.reload(force)).await {
                Ok(Ok(true)) => tracing::info!(cert = %c.files.cert.display(), "TLS certificate reloaded"),
                Ok(Ok(false)) => {}
                Ok(Err(e)) => tracing::error!(cert = %c.files.cert.display(), error = format!("{e:#}"), "TLS files did not reload; the previous certificate stays"),
                Err(e) => tracing::error!(error = %e, "TLS reload task failed"),
            }
        }
    }
}

/// The subject of a client certificate as Kafka's default principal
/// builder names it: the RFC 2253 distinguished name, most specific
/// attribute first (`CN=writer,OU=eng,O=canopy`).
pub fn subject_dn(cert_der: &[u8]) -> Option<String> {
    use x509_parser::prelude::*;
    let (_, cert) = X509Certificate::from_der(cert_der).ok()?;
    let mut rdns: Vec<String> = Vec::new();
    for rdn in cert.subject().iter() {
        let parts: Vec<String> = rdn
            .iter()
            .map(|atv| {
                let oid = atv.attr_type();
                let key = match oid.to_id_string().as_str() {
                    "2.5.4.3" => "CN".to_owned(),
                    "2.5.4.11" => "OU".to_owned(),
                    "2.5.4.10" => "O".to_owned(),
                    "2.5.4.7" => "L".to_owned(),
                    "2.5.4.8" => "ST".to_owned(),
                    "2.5.4.6" => "C".to_owned(),
                    "2.5.4.9" => "STREET".to_owned(),
                    "0.9.2342.19200300.100.1.25" => "DC".to_owned(),
                    "0.9.2342.19200300.100.1.1" => "UID".to_owned(),
                    other => other.to_owned(),
                };
                // Java writes a type without an RFC 2253 keyword, or a
                // value that is not a string, as `#` and the hex of the
                // value's DER encoding; so does this.
                let keyword = !key.starts_with(|c: char| c.is_ascii_digit());
                match atv.as_str() {
                    Ok(v) if keyword => format!("{key}={}", escape_dn_value(v)),
                    _ => {
                        use x509_parser::der_parser::asn1_rs::ToDer;
                        let der = atv.attr_value().to_der_vec().unwrap_or_default();
                        format!("{key}=#{}", der.iter().map(|b| format!("{b:02x}")).collect::<String>())
                    }
                }
            })
            .collect();
        rdns.push(parts.join("+"));
    }
    rdns.reverse();
    Some(rdns.join(","))
}

/// RFC 2253 escaping of an attribute value.
fn escape_dn_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for (i, c) in v.chars().enumerate() {
        let special = matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';') || (i == 0 && (c == '#' || c == ' ')) || (i + 1 == v.chars().count() && c == ' ');
        if special {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_read_as_kafka_names_them() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(rcgen::DnType::CountryName, "NL");
        p.distinguished_name.push(rcgen::DnType::OrganizationName, "canopy, inc");
        p.distinguished_name.push(rcgen::DnType::CommonName, "writer");
        let cert = p.self_signed(&key).unwrap();
        assert_eq!(subject_dn(cert.der()).unwrap(), "CN=writer,O=canopy\\, inc,C=NL");
        // An attribute without an RFC 2253 keyword: its OID and the hex DER
        // of its value (an IA5String "a@b": tag 0x16, length 3).
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(rcgen::DnType::CustomDnType(vec![1, 2, 840, 113549, 1, 9, 1]), rcgen::DnValue::Ia5String("a@b".try_into().unwrap()));
        p.distinguished_name.push(rcgen::DnType::CommonName, "x");
        let cert = p.self_signed(&key).unwrap();
        assert_eq!(subject_dn(cert.der()).unwrap(), "CN=x,1.2.840.113549.1.9.1=#1603614062");
        assert_eq!(subject_dn(b"not a certificate"), None);
    }
}
