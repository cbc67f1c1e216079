//! Private PKI for a test cluster: CA, apiserver serving certificate and service-account key,
//! all generated with rcgen (ECDSA P-256).

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

/// PEM material written into the cluster's temp dir.
#[derive(Debug, Clone)]
pub struct ClusterPki {
    /// CA certificate (PEM); trust anchor for clients.
    pub ca_cert_pem: String,
    /// CA private key (PKCS#8 PEM).
    pub ca_key_pem: String,
    /// Serving certificate for 127.0.0.1 / localhost / kubernetes.default.svc (PEM).
    pub serving_cert_pem: String,
    /// Serving key (PKCS#8 PEM).
    pub serving_key_pem: String,
    /// Service-account signing key (ECDSA P-256, PKCS#8 PEM).
    pub sa_key_pem: String,
    /// Service-account public key (SPKI PEM).
    pub sa_pub_pem: String,
}

impl ClusterPki {
    /// Generates a fresh CA, serving certificate and service-account key pair.
    pub fn generate() -> Result<Self> {
        let ca_key = KeyPair::generate().context("generating CA key")?;
        let mut ca_params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "gpu-ledger-testkit-ca");
        ca_params.distinguished_name = dn;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params.self_signed(&ca_key).context("self-signing CA")?;
        let issuer = Issuer::new(ca_params, &ca_key);

        let serving_key = KeyPair::generate().context("generating serving key")?;
        let mut sp = CertificateParams::new(vec![
            "localhost".to_string(),
            "kubernetes".to_string(),
            "kubernetes.default".to_string(),
            "kubernetes.default.svc".to_string(),
        ])
        .context("serving cert params")?;
        sp.subject_alt_names
            .push(SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()));
        sp.subject_alt_names.push(SanType::IpAddress(
            std::net::Ipv4Addr::new(10, 0, 0, 1).into(),
        ));
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "kube-apiserver");
        sp.distinguished_name = dn;
        sp.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        sp.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_cert = sp
            .signed_by(&serving_key, &issuer)
            .context("signing serving cert")?;

        let sa_key = KeyPair::generate().context("generating service-account key")?;
        Ok(Self {
            ca_cert_pem: ca_cert.pem(),
            ca_key_pem: ca_key.serialize_pem(),
            serving_cert_pem: serving_cert.pem(),
            serving_key_pem: serving_key.serialize_pem(),
            sa_key_pem: sa_key.serialize_pem(),
            sa_pub_pem: sa_key.public_key_pem(),
        })
    }
}

/// A private CA and a serving certificate it signed for `127.0.0.1` and `localhost`: for a
/// server on loopback that the kube-apiserver calls (a webhook registered by URL).
#[derive(Debug, Clone)]
pub struct LoopbackTls {
    /// CA certificate (PEM): the `caBundle` the apiserver trusts.
    pub ca_cert_pem: String,
    /// Serving certificate (PEM), `tls.crt`.
    pub cert_pem: String,
    /// Serving key (PKCS#8 PEM), `tls.key`.
    pub key_pem: String,
}

impl LoopbackTls {
    /// Generates a fresh CA and a serving certificate with common name `common_name`.
    pub fn generate(common_name: &str) -> Result<Self> {
        let ca_key = KeyPair::generate().context("generating CA key")?;
        let mut ca_params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, format!("{common_name}-ca"));
        ca_params.distinguished_name = dn;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_cert = ca_params.self_signed(&ca_key).context("self-signing CA")?;
        let issuer = Issuer::new(ca_params, &ca_key);

        let key = KeyPair::generate().context("generating serving key")?;
        let mut sp =
            CertificateParams::new(vec!["localhost".to_string()]).context("serving cert params")?;
        sp.subject_alt_names
            .push(SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()));
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, common_name);
        sp.distinguished_name = dn;
        sp.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        sp.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = sp
            .signed_by(&key, &issuer)
            .context("signing serving cert")?;
        Ok(Self {
            ca_cert_pem: ca_cert.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}
