//! One version everywhere a release names it: Cargo.toml, the chart's `version` and `appVersion`,
//! the image tag the chart defaults to, the krew manifest template, the Dockerfile's label and the
//! install lines of README.md and docs/install.md, and the registry names the release workflow
//! publishes to. A release bumps them together or this fails.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, ensure};
use gpu_ledger_testkit::process::run;
use regex::Regex;
use serde_json::Value;

const CHART: &str = "deploy/helm/gpu-ledger";
/// The crate version: this test is compiled from the same Cargo.toml.
const VERSION: &str = env!("CARGO_PKG_VERSION");

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> Result<String> {
    std::fs::read_to_string(root().join(path)).with_context(|| format!("reading {path}"))
}

fn yaml(path: &str) -> Result<Value> {
    serde_norway::from_str(&read(path)?).with_context(|| format!("parsing {path}"))
}

/// GitHub owner of the repository in Cargo.toml (`https://github.com/<owner>/<name>`): the
/// release workflow publishes under `ghcr.io/<owner>`.
fn owner() -> Result<String> {
    let repo = env!("CARGO_PKG_REPOSITORY");
    let rest = repo
        .strip_prefix("https://github.com/")
        .with_context(|| format!("repository {repo:?} is not on github.com"))?;
    Ok(rest.split('/').next().unwrap_or_default().to_lowercase())
}

#[test]
fn chart_and_image_tag_carry_the_crate_version() -> Result<()> {
    let chart = yaml(&format!("{CHART}/Chart.yaml"))?;
    ensure!(
        chart["version"] == VERSION,
        "Chart.yaml version {} is not Cargo.toml's {VERSION}",
        chart["version"]
    );
    ensure!(
        chart["appVersion"] == VERSION,
        "Chart.yaml appVersion {} is not Cargo.toml's {VERSION}",
        chart["appVersion"]
    );
    let values = yaml(&format!("{CHART}/values.yaml"))?;
    let image = format!("ghcr.io/{}/gpu-ledger", owner()?);
    ensure!(
        values["image"]["repository"] == image.as_str(),
        "values.yaml image.repository {} is not what the release pushes ({image})",
        values["image"]["repository"]
    );
    ensure!(
        values["image"]["tag"] == "",
        "values.yaml image.tag must stay \"\" (= appVersion), not {}",
        values["image"]["tag"]
    );

    // The rendered Deployment runs exactly the image the release workflow tags.
    let helm = gpu_ledger_testkit::binary("helm")?;
    // Helm's own directories: cargo's scratch dir, nothing in $HOME.
    let home = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("release-version-helm");
    let mut c = Command::new(helm);
    c.current_dir(root())
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env_remove("KUBECONFIG")
        .args([
            "template",
            "gpu-ledger",
            CHART,
            "--kube-version",
            "v1.36.3",
            "--show-only",
            "templates/deployment.yaml",
        ]);
    let out = run(c, None)?;
    ensure!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rendered = String::from_utf8_lossy(&out.stdout);
    let want = format!("image: {image}:{VERSION}");
    ensure!(
        rendered.contains(&want),
        "the Deployment does not run {want}:\n{rendered}"
    );

    let dockerfile = read("Dockerfile")?;
    ensure!(
        dockerfile.contains(&format!("ARG GPU_LEDGER_VERSION={VERSION}\n")),
        "Dockerfile's default GPU_LEDGER_VERSION label is not {VERSION}"
    );
    Ok(())
}

#[test]
fn krew_manifest_is_generated_for_the_crate_version() -> Result<()> {
    let template = yaml("deploy/krew/gpu-ledger.yaml.in")?;
    ensure!(
        template["spec"]["version"] == format!("v{VERSION}").as_str(),
        "deploy/krew/gpu-ledger.yaml.in spec.version {} is not v{VERSION}",
        template["spec"]["version"]
    );
    ensure!(
        template["metadata"]["name"] == "gpu-ledger",
        "kubectl gpu-ledger"
    );

    // Generate it as the release workflow does, from archives named as the workflow names them.
    let release = read(".github/workflows/release.yml")?;
    ensure!(
        release.contains("dist/gpu-ledger-v$VERSION-linux-$ARCH.tar.gz")
            && release.contains("scripts/krew-manifest.sh"),
        "release.yml no longer names the archives gpu-ledger-v<version>-linux-<arch>.tar.gz \
         or no longer runs scripts/krew-manifest.sh"
    );
    let dist = tempfile::tempdir()?;
    let mut sums = Vec::new();
    for arch in ["amd64", "arm64"] {
        let body = format!("archive for {arch}");
        std::fs::write(
            dist.path()
                .join(format!("gpu-ledger-v{VERSION}-linux-{arch}.tar.gz")),
            &body,
        )?;
        let digest = ring::digest::digest(&ring::digest::SHA256, body.as_bytes());
        sums.push(digest.as_ref().iter().fold(String::new(), |mut hex, b| {
            let _ = write!(hex, "{b:02x}");
            hex
        }));
    }
    let base = format!(
        "https://github.com/{}/gpu-ledger/releases/download/v{VERSION}",
        owner()?
    );
    let mut c = Command::new(root().join("scripts/krew-manifest.sh"));
    c.args([VERSION, base.as_str()]).arg(dist.path());
    let out = run(c, None)?;
    ensure!(
        out.status.success(),
        "krew-manifest.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let manifest: Value = serde_norway::from_slice(&out.stdout)?;
    ensure!(manifest["kind"] == "Plugin");
    ensure!(manifest["spec"]["version"] == format!("v{VERSION}").as_str());
    let platforms = manifest["spec"]["platforms"]
        .as_array()
        .context("spec.platforms")?;
    ensure!(platforms.len() == 2, "{platforms:?}");
    for (p, (arch, sum)) in platforms.iter().zip(["amd64", "arm64"].iter().zip(&sums)) {
        ensure!(p["selector"]["matchLabels"]["arch"] == *arch, "{p}");
        ensure!(
            p["uri"] == format!("{base}/gpu-ledger-v{VERSION}-linux-{arch}.tar.gz").as_str(),
            "{p}"
        );
        ensure!(p["sha256"] == sum.as_str(), "{p}");
        ensure!(p["bin"] == "gpu-ledger", "{p}");
    }

    // Another version than the template's is refused (no manifest naming the wrong archives).
    let mut c = Command::new(root().join("scripts/krew-manifest.sh"));
    c.args(["9.9.9", base.as_str()]).arg(dist.path());
    let out = run(c, None)?;
    ensure!(
        !out.status.success(),
        "krew-manifest.sh accepted a version the template does not carry"
    );
    Ok(())
}

#[test]
fn install_lines_name_what_the_release_publishes() -> Result<()> {
    let owner = owner()?;
    let release = read(".github/workflows/release.yml")?;
    // The workflow's registry paths, with the owner it computes from the repository.
    for (what, needle) in [
        (
            "image",
            "IMAGE: ghcr.io/${{ needs.version.outputs.owner }}/gpu-ledger",
        ),
        ("chart", "\"oci://ghcr.io/$OWNER/charts\""),
        ("krew manifest", "dist/gpu-ledger.yaml"),
    ] {
        ensure!(
            release.contains(needle),
            "release.yml no longer publishes the {what} as {needle}"
        );
    }
    let chart_ref = format!("oci://ghcr.io/{owner}/charts/gpu-ledger --version {VERSION}");
    let image_ref = format!("ghcr.io/{owner}/gpu-ledger:{VERSION}");
    let krew_ref = format!(
        "https://github.com/{owner}/gpu-ledger/releases/download/v{VERSION}/gpu-ledger.yaml"
    );
    let readme = read("README.md")?;
    // "The first screen": the install block comes before the page screenshot.
    let first_screen = readme
        .split("![The page")
        .next()
        .context("README.md has no screenshot")?;
    for want in [&chart_ref, &image_ref, &krew_ref] {
        ensure!(
            first_screen.contains(want.as_str()),
            "README.md's first screen does not show {want}"
        );
    }
    ensure!(
        read(&format!("{CHART}/README.md"))?.contains(&chart_ref),
        "the chart README does not show {chart_ref} (scripts/chart-readme.sh)"
    );

    // Every versioned reference to a published artifact, in every install document, is this one.
    let refs = Regex::new(
        r"(?:charts/gpu-ledger --version |gpu-ledger/gpu-ledger:|releases/download/v|gpu-ledger:)(\d+\.\d+\.\d+)",
    )?;
    for doc in [
        "README.md",
        "docs/install.md",
        "docs/testing.md",
        "deploy/helm/gpu-ledger/README.md",
    ] {
        for m in refs.captures_iter(&read(doc)?) {
            ensure!(
                &m[1] == VERSION,
                "{doc} names {} where the release is {VERSION}",
                &m[0]
            );
        }
    }
    Ok(())
}

#[test]
fn release_profile_strips_the_binary() -> Result<()> {
    let cargo = read("Cargo.toml")?;
    let section = cargo
        .split("[profile.release]")
        .nth(1)
        .context("Cargo.toml has no [profile.release]")?;
    let section = section.split("\n[").next().unwrap_or_default();
    ensure!(
        section.lines().any(|l| l.trim() == "strip = true"),
        "[profile.release] does not strip the shipped binary:\n{section}"
    );
    Ok(())
}
