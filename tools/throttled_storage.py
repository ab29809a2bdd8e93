#!/usr/bin/python3
"""A storage device of known, steady speed, for measuring budgeted decode against its bound.

A shared virtual disk is a poor yardstick: its speed drifts between minutes, and many are token
buckets that read at 2 GB/s for half a second after an idle spell and at a fraction of that after
(this project's CI machines: 2.0-2.3 GB/s for 0.6 s, then 0.4-0.6 GB/s). A budgeted decode leaves
the disk idle between layers, so it is served partly from the burst, and "the storage's speed"
has no single value to divide by.

This makes one whose sustained speed is the number given (and, with iops, whose read requests per
second are capped too, as on SD cards and eMMC, where a request's latency and not the bytes can set
the cost): an ext4 image in RAM (/dev/shm) mounted
through a loop device, and a cgroup that caps reads from that device at R bytes per second (cgroup
v1 blkio.throttle.read_bps_device and read_iops_device, or v2 io.max). A packed expert file beside
the model (MODEL.experts) is copied with it. Experts read with O_DIRECT pass through the loop
device and its cap; nothing comes from the page cache. The loop device copies from RAM on the
CPU, which a real NVMe drive (DMA) does not: 0.29 core-seconds per GB on a Zen 3 VM (uncapped,
3.5 GB/s kept one core busy), so at 2 GB/s a 2-core machine lends more than half a core to its
"disk". Keep R well below what the machine's cores can spare.

The cap may not hold for io_uring's reads: on an AMD EPYC Zen 3 VM (cgroup v1) the store's
io_uring reads ran at 5-6 GB/s through a 1 GB/s cap, while its pread fallback
(MOELITE_IO=pread) read at 1.07. Check the bench's storage_read_gb_s against R.

Needs root. Use as a context manager:

    with ThrottledStorage(model, gb_s=1.5) as dev:
        subprocess.run([... dev.model ...], preexec_fn=dev.enter)

or from the shell, to run one command on the throttled copy ({model} is replaced by its path):

    sudo /usr/bin/python3 tools/throttled_storage.py --gb-s 1.5 MODEL -- moelite bench -m {model} --budget 25%
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

CGROUP_V1_BLKIO = "/sys/fs/cgroup/blkio"
CGROUP_V2 = "/sys/fs/cgroup"


def _run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(cmd), r.returncode, r.stderr.strip()))
    return r.stdout


class ThrottledStorage:
    def __init__(self, model, gb_s, shm="/dev/shm", iops=0):
        if os.geteuid() != 0:
            raise RuntimeError("a throttled device needs root (loop devices, cgroups)")
        if not gb_s > 0:
            raise ValueError("the speed must be above 0 GB/s")
        self.source = model
        self.bytes_per_s = int(gb_s * 1e9)
        self.iops = int(iops)  # 0: no cap on read requests per second
        self.shm = shm
        self.dir = self.mount = self.cgroup = self.device = None
        self.model = None

    def __enter__(self):
        try:
            self._make()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _make(self):
        # The model and its packed expert file (MODEL.experts) when there is one.
        sources = [p for p in (self.source, self.source + ".experts") if os.path.exists(p)]
        size = sum(os.path.getsize(p) for p in sources)
        image_bytes = size + size // 10 + (128 << 20)  # ext4's own blocks, journal and slack
        free = shutil.disk_usage(self.shm).free
        if free < image_bytes + (512 << 20):
            raise RuntimeError("%s has %.1f GiB free; the image needs %.1f GiB" % (self.shm, free / 2**30,
                                                                                  image_bytes / 2**30))
        self.dir = tempfile.mkdtemp(prefix="moelite-throttled-", dir=self.shm)
        image = os.path.join(self.dir, "image.ext4")
        with open(image, "wb") as f:
            f.truncate(image_bytes)
        _run(["mkfs.ext4", "-q", "-F", image])
        self.mount = tempfile.mkdtemp(prefix="moelite-throttled-mnt-")
        _run(["mount", "-o", "loop", image, self.mount])
        self.device = _run(["findmnt", "-n", "-o", "SOURCE", self.mount]).strip()
        self.model = os.path.join(self.mount, os.path.basename(self.source))
        for p in sources:
            shutil.copyfile(p, os.path.join(self.mount, os.path.basename(p)))
        os.sync()
        rdev = os.stat(self.device).st_rdev
        majmin = "%d:%d" % (os.major(rdev), os.minor(rdev))
        name = "moelite-throttled-%d" % os.getpid()
        if os.path.isdir(CGROUP_V1_BLKIO):
            self.cgroup = os.path.join(CGROUP_V1_BLKIO, name)
            os.mkdir(self.cgroup)
            with open(os.path.join(self.cgroup, "blkio.throttle.read_bps_device"), "w") as f:
                f.write("%s %d\n" % (majmin, self.bytes_per_s))
            if self.iops:
                with open(os.path.join(self.cgroup, "blkio.throttle.read_iops_device"), "w") as f:
                    f.write("%s %d\n" % (majmin, self.iops))
        elif "io" in open(os.path.join(CGROUP_V2, "cgroup.controllers")).read().split():
            with open(os.path.join(CGROUP_V2, "cgroup.subtree_control"), "w") as f:
                f.write("+io\n")
            self.cgroup = os.path.join(CGROUP_V2, name)
            os.mkdir(self.cgroup)
            with open(os.path.join(self.cgroup, "io.max"), "w") as f:
                f.write("%s rbps=%d%s\n" % (majmin, self.bytes_per_s, " riops=%d" % self.iops if self.iops else ""))
        else:
            raise RuntimeError("no cgroup I/O controller (blkio or io) to throttle the device with")

    def enter(self):
        """Moves the calling process into the throttled cgroup (a subprocess's preexec_fn)."""
        with open(os.path.join(self.cgroup, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))

    def __exit__(self, *exc):
        if self.cgroup and os.path.isdir(self.cgroup):
            try:
                os.rmdir(self.cgroup)
            except OSError as e:
                print("throttled_storage: cgroup %s left behind: %s" % (self.cgroup, e), file=sys.stderr)
        if self.mount:
            # A mount can be busy for a moment after its last reader exits; a lazy unmount then
            # detaches it anyway (the loop device goes once nothing uses it).
            for _ in range(10):
                if subprocess.run(["umount", self.mount], capture_output=True).returncode == 0:
                    break
                time.sleep(0.2)
            else:
                r = subprocess.run(["umount", "-l", self.mount], capture_output=True, text=True)
                print("throttled_storage: %s was busy; lazy unmount: %s" % (self.mount, r.returncode == 0 and "done"
                                                                             or r.stderr.strip()), file=sys.stderr)
            try:
                os.rmdir(self.mount)
            except OSError:
                pass
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb-s", type=float, required=True, help="sustained read speed of the device")
    ap.add_argument("--iops", type=int, default=0, help="most read requests per second (0: no cap), as flash "
                    "cards and eMMC have")
    ap.add_argument("model")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        sys.exit("give a command after --")
    with ThrottledStorage(a.model, a.gb_s, iops=a.iops) as dev:
        sys.exit(subprocess.run([c.replace("{model}", dev.model) for c in cmd], preexec_fn=dev.enter).returncode)


if __name__ == "__main__":
    main()
