"""Host keys as OpenSSH checks them: the real `ssh` client and debugagent give the same answer
against the same sshd and the same known_hosts, case by case."""

from __future__ import annotations

import base64
import getpass
import hashlib
import hmac
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from debugagent.tools import known_hosts
from debugagent.tools.errors import HostKeyError
from debugagent.tools.sim.serve import SSHD, start_sshd
from debugagent.tools.ssh import SSHTransport

pytestmark = [pytest.mark.ssh, pytest.mark.skipif(not Path(SSHD).is_file() or not shutil.which("ssh"),
                                                  reason="needs Debian's openssh-server and openssh-client")]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    """A private sshd (one ed25519 host key), plus a second ed25519 key and an RSA key that are not its."""
    d = tmp_path_factory.mktemp("sshd")
    s = start_sshd(d)
    for name, kind in (("other", "ed25519"), ("other_rsa", "rsa")):
        subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(d / name)], check=True)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def certified(tmp_path_factory):
    """A private sshd whose ed25519 host key has a host certificate for 127.0.0.1, signed by CA."""
    d = tmp_path_factory.mktemp("sshd-cert")
    for name in ("ca", "other", "host_ed25519"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)], check=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "rsa", "-N", "", "-f", str(d / "other_rsa")], check=True)
    subprocess.run(["ssh-keygen", "-q", "-s", str(d / "ca"), "-I", "gpu-host", "-h", "-n", "127.0.0.1",
                    "-V", "-5m:+1d", str(d / "host_ed25519.pub")], check=True, capture_output=True)
    s = start_sshd(d, extra_config=(f"HostCertificate {d / 'host_ed25519-cert.pub'}",))
    yield s
    s.stop()


def _pub(path: Path) -> str:
    kind, b64 = path.read_text().split()[:2]
    return f"{kind} {b64}"


def _hashed(name: str) -> str:
    salt = os.urandom(20)
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


# each case: known_hosts lines, with N = [127.0.0.1]:PORT, K = the server's key, O = another
# ed25519 key, R = an RSA key; H(name) = that name hashed
CASES = {
    "exact": ["N K"],
    "star": ["* K"],
    "question-mark": ["[127.0.0.?]:P K"],
    "port-wildcard": ["[127.0.0.1]:* K"],
    "comma-list": ["gpu-box,10.0.0.9,N K"],
    "negated": ["*,!N K"],
    "negated-elsewhere": ["*,!gpu-box K"],
    "hashed": ["H(N) K"],
    "hashed-other-name": ["H(gpu-box) K"],
    "no-port-second-look": ["127.0.0.1 K"],
    "no-port-other-key": ["127.0.0.1 O"],
    "no-port-wildcard-other-key": ["127.0.0.* O"],
    "case-insensitive-name": ["[LOCALHOST]:P O", "N K"],
    "revoked": ["N K", "@revoked * K"],
    "revoked-alone": ["@revoked N K"],
    "revoked-other-name": ["N K", "@revoked gpu-box K"],
    "revoked-other-key": ["N K", "@revoked * O"],
    "changed-exact": ["N O"],
    "changed-under-wildcard": ["* O"],
    "changed-under-pattern": ["[127.0.0.*]:P O"],
    "changed-hashed": ["H(N) O"],
    "other-key-then-right-one": ["* O", "N K"],
    "other-key-type": ["N R"],
    "cert-authority-plain-key": ["@cert-authority * K"],
    "cert-authority-and-known": ["@cert-authority * O", "N K"],
    "garbage-lines": ["# comment", "@bogus N O", "N ssh-ed25519 !!notbase64", "N K"],
}


def _write(sshd, lines: list[str], path: Path) -> Path:
    d = sshd.folder
    subst = {"K": _pub(d / "host_ed25519.pub"), "O": _pub(d / "other.pub"), "R": _pub(d / "other_rsa.pub")}
    if (d / "ca.pub").exists():
        subst["CA"] = _pub(d / "ca.pub")
    out = []
    n = f"[127.0.0.1]:{sshd.port}"
    for line in lines:
        words = line.split()
        words = [subst.get(w, w) for w in words]
        words = [n if w == "N" else _hashed(n) if w == "H(N)" else _hashed(w[2:-1]) if w.startswith("H(") else
                 w.replace(":P", f":{sshd.port}") for w in words]
        out.append(" ".join(words))
    path.write_text("\n".join(out) + "\n")
    return path


def openssh_answer(sshd, kh: Path, mode: str) -> str:
    """What the real ssh client says: ok, unknown, changed or revoked."""
    r = subprocess.run(["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={kh}",
                        "-o", "GlobalKnownHostsFile=/dev/null", "-o", f"StrictHostKeyChecking={mode}",
                        "-o", "UpdateHostKeys=no", "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=20",
                        "-i", str(sshd.identity), "-p", str(sshd.port), f"{getpass.getuser()}@127.0.0.1", "true"],
                       capture_output=True, text=True, timeout=60)
    return ssh_verdict(r, ("Host key verification failed",))


def ssh_verdict(r: subprocess.CompletedProcess[str], unknown: tuple[str, ...]) -> str:
    """ok, revoked or changed from what `ssh` printed; unknown only where it printed one of ``unknown``."""
    if r.returncode == 0:
        return "ok"
    if "REVOKED" in r.stderr or "revoked" in r.stderr:
        return "revoked"
    if "HAS CHANGED" in r.stderr:
        return "changed"
    assert any(u in r.stderr for u in unknown), r.stderr
    return "unknown"


def debugagent_answer(sshd, kh: Path, accept_new: bool) -> str:
    return our_verdict(f"{getpass.getuser()}@127.0.0.1:{sshd.port}", identity_file=str(sshd.identity),
                       known_hosts=str(kh), accept_new=accept_new)


def our_verdict(spec: str, **kw) -> str:
    """ok, unknown, changed or revoked: what debugagent's transport decides for ``spec``."""
    try:
        SSHTransport.from_spec(spec, connect_timeout=20, **kw).close()
    except HostKeyError as exc:
        assert exc.exit_code == 4
        msg = str(exc)
        return "revoked" if "REVOKED" in msg else "changed" if "CHANGED" in msg else "unknown"
    return "ok"


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_answer_as_openssh(sshd, tmp_path, case):
    """Strict checking and accept-new: debugagent accepts, refuses (unknown, changed, revoked) and
    appends exactly where OpenSSH's ssh does."""
    kh = _write(sshd, CASES[case], tmp_path / "kh_ours")
    theirs = tmp_path / "kh_theirs"
    shutil.copy(kh, theirs)
    strict = openssh_answer(sshd, theirs, "yes"), debugagent_answer(sshd, kh, False)
    assert strict[1] == strict[0], f"{case}: ssh says {strict[0]}, debugagent {strict[1]}"
    assert kh.read_text() == theirs.read_text()
    new = openssh_answer(sshd, theirs, "accept-new"), debugagent_answer(sshd, kh, True)
    assert new[1] == new[0], f"{case} (accept-new): ssh says {new[0]}, debugagent {new[1]}"
    # where ssh appended the key, we did too, and both files now accept the host
    grew_theirs = len(theirs.read_text().splitlines()) > len(CASES[case])
    grew_ours = len(kh.read_text().splitlines()) > len(CASES[case])
    assert grew_ours == grew_theirs
    if grew_ours:
        assert openssh_answer(sshd, kh, "yes") == "ok"


# against a host that presents a certificate signed by CA (its plain key is K)
CERT_CASES = {
    "ca-known": ["@cert-authority * CA"],
    "ca-known-by-pattern": ["@cert-authority [127.0.0.?]:* CA"],
    "ca-for-another-host": ["@cert-authority gpu-box CA"],
    "ca-negated": ["@cert-authority *,!N CA"],
    "ca-unknown": ["@cert-authority * O"],
    "ca-revoked": ["@cert-authority * CA", "@revoked * CA"],
    "ca-unknown-plain-known": ["@cert-authority * O", "N K"],
    "ca-unknown-plain-changed": ["@cert-authority * O", "N O"],
    "ca-known-plain-changed": ["@cert-authority * CA", "N O"],
    "plain-known-only": ["N K"],
    "plain-revoked-ca-known": ["@cert-authority * CA", "@revoked * K"],
    "ca-line-is-not-a-host-key": ["N CA"],
}


@pytest.mark.parametrize("case", sorted(CERT_CASES))
def test_host_certificates_same_answer_as_openssh(certified, tmp_path, case):
    """@cert-authority: a certificate from a known authority is accepted, and otherwise the plain key
    inside it decides, exactly where OpenSSH's ssh does so."""
    CASES[f"cert:{case}"] = CERT_CASES[case]
    try:
        test_same_answer_as_openssh(certified, tmp_path, f"cert:{case}")
    finally:
        del CASES[f"cert:{case}"]


def test_revoked_key_is_exit_4_saying_revoked(sshd, tmp_path):
    """A revoked key is refused with exit 4 and the word "revoked", even with accept-new, and is never appended."""
    kh = _write(sshd, ["@revoked * K"], tmp_path / "kh")
    before = kh.read_text()
    r = subprocess.run([sys.executable, "-m", "debugagent.agent.cli", "snapshot",
                        "--host", f"{getpass.getuser()}@127.0.0.1:{sshd.port}", "--identity-file", str(sshd.identity),
                        "--known-hosts", str(kh), "--accept-new-host-key", "-o", str(tmp_path / "s.json")],
                       capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 4, r.stderr
    assert "REVOKED" in r.stderr and "@revoked" in r.stderr
    assert kh.read_text() == before and not (tmp_path / "s.json").exists()


def test_host_patterns():
    """Wildcards, negation and hashed names match as OpenSSH's match_hostname does."""
    m = known_hosts.host_matches
    assert m("*.corp,!bad.corp", "gpu.corp") and not m("*.corp,!bad.corp", "bad.corp")
    assert m("gpu-?", "gpu-1") and not m("gpu-?", "gpu-10")
    assert m("[10.0.0.1]:*", "[10.0.0.1]:2222") and not m("10.0.0.1", "[10.0.0.1]:2222")
    assert not m("gpu-box", "gpu-box2") and not m("gpu", "gpu-box")
    assert m("GPU-BOX", "gpu-box") and not m("!gpu-box", "gpu-box")
    h = _hashed("[gpu]:2200")
    assert m(h, "[gpu]:2200") and not m(h, "gpu")


# ---------------------------------------------------------------- the files ssh's configuration names
# each case: the ssh_config lines (U1, U2 = user files, G = a global file, in this test's folder) and the
# known_hosts lines of each file (N, K, O, H(...) as above); the host is reached through its config entry `box`
CONFIG_CASES = {
    "global-file-revokes": (["UserKnownHostsFile U1", "GlobalKnownHostsFile G"], {"U1": ["N K"], "G": ["@revoked * K"]}),
    "global-file-knows": (["UserKnownHostsFile U1", "GlobalKnownHostsFile G"], {"U1": [], "G": ["N K"]}),
    "global-file-changed": (["UserKnownHostsFile U1", "GlobalKnownHostsFile G"], {"U1": [], "G": ["N O"]}),
    "configured-user-file-changed": (["UserKnownHostsFile U1", "GlobalKnownHostsFile G"],
                                     {"U1": ["N O"], "U2": ["N K"], "G": []}),
    "second-user-file-knows": (["UserKnownHostsFile U1 U2", "GlobalKnownHostsFile G"], {"U1": [], "U2": ["N K"], "G": []}),
    "second-user-file-revokes": (["UserKnownHostsFile U1 U2", "GlobalKnownHostsFile G"],
                                 {"U1": ["N K"], "U2": ["@revoked * K"], "G": []}),
    "no-user-file": (["UserKnownHostsFile none", "GlobalKnownHostsFile G"], {"G": ["N K"]}),
    "alias-known": (["UserKnownHostsFile U1", "GlobalKnownHostsFile G", "HostKeyAlias gpu-alias"],
                    {"U1": ["gpu-alias K"], "G": []}),
    "alias-hashed": (["UserKnownHostsFile U1", "GlobalKnownHostsFile G", "HostKeyAlias gpu-alias"],
                     {"U1": ["H(gpu-alias) K"], "G": []}),
    "alias-not-the-address": (["UserKnownHostsFile U1", "GlobalKnownHostsFile G", "HostKeyAlias gpu-alias"],
                              {"U1": ["N K"], "G": []}),
    "alias-changed": (["UserKnownHostsFile U1", "GlobalKnownHostsFile G", "HostKeyAlias gpu-alias"],
                      {"U1": ["gpu-alias O", "N K"], "G": []}),
    "alias-upper-case": (["UserKnownHostsFile U1", "GlobalKnownHostsFile G", "HostKeyAlias GPU-Alias"],
                         {"U1": ["gpu-alias K"], "G": []}),
    "new-key-hashed": (["UserKnownHostsFile U1", "GlobalKnownHostsFile G", "HashKnownHosts yes"], {"U1": [], "G": []}),
    "tokens-in-file-name": (["UserKnownHostsFile T/kh-%h-%p-%r", "GlobalKnownHostsFile G"],
                            {"T/kh-127.0.0.1-PORT-USER": ["N K"], "G": []}),
}


def _config_case(sshd, tmp_path: Path, case: str) -> tuple[Path, dict[str, Path]]:
    """Writes the case's files and ~/.ssh/config (the test's $HOME); returns the config and the files."""
    options, files = CONFIG_CASES[case]
    home = Path(os.environ["HOME"])
    paths = {name: tmp_path / name.removeprefix("T/").replace("PORT", str(sshd.port)).replace("USER", getpass.getuser())
             for name in files}
    for name, lines in files.items():
        _write(sshd, lines, paths[name])
    subst = {n: str(p) for n, p in paths.items() if not n.startswith("T/")}
    opts = [" ".join(subst.get(w, w.replace("T/", f"{tmp_path}/")) for w in o.split()) for o in options]
    (home / ".ssh").mkdir(exist_ok=True)
    cfg = home / ".ssh" / "config"
    cfg.write_text(f"Host box\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {getpass.getuser()}\n"
                   f"  IdentityFile {sshd.identity}\n  IdentitiesOnly yes\n  UpdateHostKeys no\n"
                   + "".join(f"  {o}\n" for o in opts))
    return cfg, paths


def _ssh_with_config(cfg: Path, mode: str) -> str:
    r = subprocess.run(["ssh", "-F", str(cfg), "-o", "BatchMode=yes", "-o", f"StrictHostKeyChecking={mode}",
                        "-o", "ConnectTimeout=20", "box", "true"], capture_output=True, text=True, timeout=60)
    return ssh_verdict(r, ("Host key verification failed", "No ED25519 host key is known"))


def _ours_with_config(accept_new: bool) -> str:
    return our_verdict("box", accept_new=accept_new)


@pytest.mark.parametrize("case", sorted(CONFIG_CASES))
def test_the_files_ssh_config_names_same_answer_as_openssh(sshd, tmp_path, case):
    """UserKnownHostsFile (a list, `none`, `%` tokens), GlobalKnownHostsFile and HostKeyAlias from the
    user's ssh_config decide as they decide for `ssh`: strict and accept-new, and the files change alike."""
    cfg, paths = _config_case(sshd, tmp_path, case)
    before = {n: p.read_text() for n, p in paths.items()}
    theirs = _ssh_with_config(cfg, "yes")
    after_theirs = {n: p.read_text() for n, p in paths.items()}
    ours = _ours_with_config(False)
    assert ours == theirs, f"{case}: ssh says {theirs}, debugagent {ours}"
    assert {n: p.read_text() for n, p in paths.items()} == after_theirs == before
    theirs = _ssh_with_config(cfg, "accept-new")
    grew_theirs = {n for n, p in paths.items() if p.read_text() != before[n]}
    for n, p in paths.items():
        p.write_text(before[n])
    ours = _ours_with_config(True)
    assert ours == theirs, f"{case} (accept-new): ssh says {theirs}, debugagent {ours}"
    grew_ours = {n for n, p in paths.items() if p.read_text() != before[n]}
    assert grew_ours == grew_theirs, f"{case}: ssh wrote {grew_theirs}, debugagent {grew_ours}"
    if grew_ours:
        assert _ssh_with_config(cfg, "yes") == "ok"
        hashed = "HashKnownHosts yes" in options_of(case)
        assert all(line.startswith("|1|") == hashed for n in grew_ours for line in paths[n].read_text().splitlines()
                   if line not in before[n].splitlines())


def options_of(case: str) -> list[str]:
    return CONFIG_CASES[case][0]


def test_resolve_reads_the_known_hosts_options_and_their_defaults(tmp_path):
    """Without a word in the config, the files are OpenSSH's defaults (the system's /etc/ssh/ssh_known_hosts
    among them); CheckHostIP and HashKnownHosts are read as ssh reads them."""
    from debugagent.tools.ssh.config import resolve
    home = Path(os.environ["HOME"])
    (home / ".ssh").mkdir(exist_ok=True)
    (home / ".ssh" / "config").write_text("Host plain\n  HostName 127.0.0.1\nHost set\n  HostName 127.0.0.1\n"
                                          "  CheckHostIP yes\n  HashKnownHosts yes\n  HostKeyAlias Box-1\n")
    r = resolve("plain", None)
    assert r["global_known_hosts"] == ["/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2"]
    assert r["known_hosts"] == [str(home / ".ssh" / "known_hosts"), str(home / ".ssh" / "known_hosts2")]
    assert (r["check_host_ip"], r["hash_known_hosts"], r["host_key_alias"]) == (False, False, None)
    r = resolve("set", None)
    assert (r["check_host_ip"], r["hash_known_hosts"]) == (True, True)
    assert r["host_key_alias"] is not None and r["host_key_alias"].lower() == "box-1"


def test_check_host_ip_applies_where_ssh_applies_it():
    """CheckHostIP looks at the address only off loopback, for a host named otherwise, with no alias."""
    from debugagent.tools.ssh.hostkeys import Policy
    files = known_hosts.Files(())
    p = Policy(files, False, "gpu-box", 22, check_ip=True)
    p.ip = "10.0.0.9"
    assert p.ip_name() == "10.0.0.9"
    p.ip = "127.0.0.1"
    assert p.ip_name() is None
    p = Policy(files, False, "10.0.0.9", 2222, check_ip=True)
    p.ip = "10.0.0.9"
    assert p.ip_name() is None
    p = Policy(files, False, "gpu-box", 2222, check_ip=True)
    p.ip = "10.0.0.9"
    assert p.ip_name() == "[10.0.0.9]:2222"
    p = Policy(files, False, "gpu-box", 22, check_ip=False)
    p.ip = "10.0.0.9"
    assert p.ip_name() is None


def test_lookup_names_are_lower_case_as_ssh_looks_them_up():
    """ssh lowercases the host name before it looks; a hashed line holds the lowercased name."""
    assert known_hosts.lookup_name("GPU-Box", 22) == "gpu-box"
    assert known_hosts.lookup_name("GPU-Box", 2200) == "[gpu-box]:2200"
    line = known_hosts.hash_name("[gpu-box]:2200")
    assert known_hosts.host_matches(line, known_hosts.lookup_name("GPU-BOX", 2200))
