"""Runs one section's command blocks of the README as written, inside a network namespace
of its own (started by `test_readme.py` with `unshare`), and checks that they did what
the README says.

Only addresses and places are substituted: each `10.x.y.z` of the examples becomes a
loopback address of its own (so several "hosts" share nothing, and no default port is
taken from the real machine), and `/var/lib/...` and `/etc/meshd` move into a temporary
directory. Commands that start daemons (`meshd server`, `meshd agent`, `meshd connect
envoy`) run in the background; the others run in turn with the shell variables and umask
the previous ones left. Usage: `python3 readme_runner.py README SECTION` (prints what it
does; exits 1 naming the first failure).
"""

import json
import os
import re
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

DAEMONS = ("meshd server", "meshd agent", "meshd connect envoy")


def lo_up():
    """Brings the namespace's loopback up (SIOCSIFFLAGS: IFF_UP | IFF_LOOPBACK | IFF_RUNNING)."""
    import fcntl

    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    ifr = struct.pack("16sH14s", b"lo", 0x1 | 0x8 | 0x40, b"\0" * 14)
    fcntl.ioctl(s.fileno(), 0x8914, ifr)


def private_shm():
    """Envoy's hot-restart shared memory (`/dev/shm`) is not per network namespace: a tmpfs
    of this mount namespace keeps base id 0 from meeting another Envoy's."""
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", "/dev/shm"], check=True)


def section_blocks(readme, title):
    """The ```sh blocks under `## title`, up to the next `## ` heading."""
    text = open(readme).read()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    body = text[start : end if end >= 0 else len(text)]
    return re.findall(r"```sh\n(.*?)```", body, re.S)


def commands(block):
    """Splits a block into commands: `\\`-continued lines joined, a heredoc kept whole,
    blank and comment lines dropped."""
    out, lines = [], block.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        while line.endswith("\\") and i < len(lines):
            line = line[:-1] + " " + lines[i].strip()
            i += 1
        heredoc = re.search(r"<<'?(\w+)'?", line)
        if heredoc:
            end = heredoc.group(1)
            while i < len(lines):
                line += "\n" + lines[i]
                i += 1
                if lines[i - 1].strip() == end:
                    break
        out.append(line)
    return out


class Runner:
    def __init__(self, tmp):
        self.tmp = tmp
        self.work = os.path.join(tmp, "work")
        os.makedirs(self.work)
        self.hosts = {}
        self.env = dict(os.environ)
        bins = [os.path.dirname(os.environ["MESHD_BIN"]), os.path.dirname(os.environ["MESHD_ENVOY"])]
        self.env["PATH"] = os.pathsep.join(bins + [self.env.get("PATH", "")])
        # Nothing of the caller's Consul settings leaks into the commands.
        for var in ("CONSUL_HTTP_TOKEN", "CONSUL_HTTP_ADDR", "CONSUL_HTTP_SSL"):
            self.env.pop(var, None)
        self.umask = "0022"
        self.daemons = []

    def host(self, address):
        """The loopback address standing for an example's `10.x.y.z`."""
        if address not in self.hosts:
            self.hosts[address] = f"127.0.0.{10 + len(self.hosts)}"
        return self.hosts[address]

    def substitute(self, command):
        command = re.sub(r"\b10\.\d+\.\d+\.\d+\b", lambda m: self.host(m.group(0)), command)
        command = command.replace("/var/lib/", os.path.join(self.tmp, "var/lib") + "/")
        return command.replace("/etc/meshd", os.path.join(self.tmp, "etc/meshd"))

    def run(self, command):
        if command.startswith("cargo build"):
            print(f"readme: skipped (the test built meshd): {command}", flush=True)
            return
        command = self.substitute(command)
        print(f"readme: $ {command}", flush=True)
        if command.startswith(DAEMONS):
            self.start(command)
            return
        state = os.path.join(self.tmp, "state")
        script = f"set -a\numask {self.umask}\n{command}\nrc=$?\nenv -0 > {state}.env\numask > {state}.umask\nexit $rc\n"
        done = subprocess.run(["bash", "-c", script], cwd=self.work, env=self.env, timeout=60,
                              capture_output=True, text=True)
        sys.stdout.write(done.stdout)
        sys.stdout.write(done.stderr)
        if done.returncode != 0:
            raise SystemExit(f"readme: failed with exit code {done.returncode}: {command}")
        self.env = dict(kv.split("=", 1) for kv in open(f"{state}.env").read().split("\0") if "=" in kv)
        self.umask = open(f"{state}.umask").read().strip()

    def start(self, command):
        log = open(os.path.join(self.tmp, f"daemon-{len(self.daemons)}.log"), "w")
        proc = subprocess.Popen(["bash", "-c", f"umask {self.umask}\nexec {command}"], cwd=self.work,
                                env=self.env, stdout=subprocess.PIPE, stderr=log, text=True)
        self.daemons.append((command, proc, log.name))
        if command.startswith("meshd connect envoy"):
            return
        # Servers and agents print their ready lines once every listener is bound.
        line = proc.stdout.readline()
        if "listening on" not in line:
            proc.wait(timeout=10)
            raise SystemExit(f"readme: no ready line ({proc.returncode}): {command}\n{open(log.name).read()}")

    def alive(self):
        for command, proc, log in self.daemons:
            if proc.poll() is not None:
                raise SystemExit(f"readme: exited with {proc.returncode}: {command}\n{open(log).read()}")

    def stop(self):
        for command, proc, log in reversed(self.daemons):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                    print(f"readme: killed after 15 s: {command}")


def get(url, token=None, ca=None):
    request = urllib.request.Request(url)
    if token:
        request.add_header("X-Consul-Token", token)
    context = ssl.create_default_context(cafile=ca) if ca else None
    with urllib.request.urlopen(request, timeout=5, context=context) as resp:
        return json.loads(resp.read() or b"null")


def eventually(what, check, runner, timeout=60):
    """Waits for `check()` to return something true; fails naming `what`."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        runner.alive()
        try:
            value = check()
            if value:
                print(f"readme: ok: {what}", flush=True)
                return value
        except Exception as e:  # noqa: BLE001 - the last error is the report
            last = e
        time.sleep(0.25)
    raise SystemExit(f"readme: not within {timeout} s: {what} (last: {last!r})")


def sidecar_synced(status):
    """An xds-status answer shows web's sidecar holding acknowledged listeners."""
    for stream in status or []:
        if stream.get("Node") != "web-sidecar-proxy":
            continue
        for t in stream.get("Types", []):
            if t["TypeUrl"].endswith("Listener") and t.get("LastAcked") and not t.get("Pending"):
                return True
    return False


def etcd_members(runner, endpoints):
    """Starts the etcd cluster the HA example names (`http://10.0.0.N:2379`, one member each)."""
    hosts = [runner.host(h) for h in re.findall(r"10\.\d+\.\d+\.\d+", endpoints)]
    cluster = ",".join(f"m{i}=http://{h}:2380" for i, h in enumerate(hosts))
    for i, h in enumerate(hosts):
        cmd = [os.environ["MESHD_ETCD"], "--name", f"m{i}", "--data-dir", os.path.join(runner.tmp, f"etcd-{i}"),
               "--listen-client-urls", f"http://{h}:2379", "--advertise-client-urls", f"http://{h}:2379",
               "--listen-peer-urls", f"http://{h}:2380", "--initial-advertise-peer-urls", f"http://{h}:2380",
               "--initial-cluster", cluster, "--initial-cluster-state", "new", "--log-level", "error"]
        log = open(os.path.join(runner.tmp, f"etcd-{i}.log"), "w")
        runner.daemons.append((f"etcd m{i}", subprocess.Popen(cmd, stdout=log, stderr=log), log.name))
    eventually("etcd answers", lambda: get(f"http://{hosts[0]}:2379/health")["health"] == "true", runner)


def check_server(runner, blocks):
    leader = eventually("the server answers", lambda: get("http://127.0.0.1:8500/v1/status/leader"), runner)
    assert leader, leader
    backup = os.path.join(runner.work, "backup.snap")
    assert os.stat(backup).st_mode & 0o777 == 0o600, "the snapshot file is private"


def check_agent(runner, blocks):
    server = f"http://{runner.host('10.0.0.10')}:8500"
    eventually("web is in the catalog on host-1",
               lambda: any(s["Node"] == "host-1" for s in get(f"{server}/v1/catalog/service/web")), runner)
    eventually("web's Envoy holds its listeners",
               lambda: sidecar_synced(get("http://127.0.0.1:8500/v1/internal/xds-status")), runner)


def check_ha(runner, blocks):
    servers = [f"http://{runner.host(a)}:8500" for a in ("10.0.1.1", "10.0.1.2")]
    for s in servers:
        eventually(f"{s} lists both servers", lambda s=s: len(get(f"{s}/v1/status/peers")) == 2, runner)
    eventually("web is in the catalog on host-1",
               lambda: any(x["Node"] == "host-1" for x in get(f"{servers[1]}/v1/catalog/service/web")), runner)
    eventually("web's Envoy holds its listeners from a server",
               lambda: any(sidecar_synced(get(f"{s}/v1/internal/xds-status")) for s in servers), runner)


def check_secure(runner, blocks):
    etc = os.path.join(runner.tmp, "etc/meshd")
    management = open(os.path.join(etc, "management.token")).read().strip()
    assert len(management) == 36, "the management token file holds a secret"
    for name in os.listdir(etc):
        mode = os.stat(os.path.join(etc, name)).st_mode & 0o777
        assert mode & 0o077 == 0, f"{name} is {oct(mode)}"
    server = f"https://{runner.host('10.0.0.10')}:8501"
    ca = os.path.join(runner.work, "meshd-agent-ca.pem")
    eventually("the agent synced web to the server (HTTPS, with ACLs)",
               lambda: any(s["Node"] == "host-1" for s in get(f"{server}/v1/catalog/service/web", management, ca)),
               runner)
    eventually("web's Envoy holds its listeners",
               lambda: sidecar_synced(get("http://127.0.0.1:8500/v1/internal/xds-status", management)), runner)
    # The server serves only TLS: nothing listens on its plain ports.
    for port in (8500, 8502):
        with socket.socket() as s:
            assert s.connect_ex((runner.host("10.0.0.10"), port)) != 0, f"the server listens on {port}"


SECTIONS = {
    "meshd server": check_server,
    "meshd agent": check_agent,
    "High availability: several servers over etcd": check_ha,
    "Secure setup": check_secure,
}


def main(readme, section):
    lo_up()
    private_shm()
    tmp = tempfile.mkdtemp(prefix="meshd-readme-")
    runner = Runner(tmp)
    try:
        if section == "meshd agent":
            # The server the agent joins, as the server section starts one.
            runner.run("meshd server -dev -http-addr 10.0.0.10:8500 -grpc-addr 10.0.0.10:8502 -dns-addr 10.0.0.10:8600")
        if section.startswith("High availability"):
            for command in commands(section_blocks(readme, "meshd agent")[0]):
                if command.startswith("cat > web.json"):
                    runner.run(command)
        blocks = section_blocks(readme, section)
        assert blocks, f"no ```sh block under ## {section}"
        for block in blocks:
            for command in commands(block):
                if section.startswith("High availability") and command.startswith("EP="):
                    etcd_members(runner, command)
                runner.run(command)
        SECTIONS[section](runner, blocks)
        runner.alive()
        print(f"readme: section {section!r} works as written", flush=True)
    finally:
        runner.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
