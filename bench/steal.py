"""CPU time the hypervisor gave to other guests while this VM's CPUs wanted to run ("steal" in /proc/stat).
On a shared VM a step can take 2-3x its median because a vCPU was not running at all; a tail latency measured
without this figure cannot tell the engine's variance from the host's."""


def cpu_jiffies() -> tuple[int, int] | None:
    """(steal, total) clock ticks summed over all CPUs since boot; None where /proc/stat has no steal column."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if fields[0] != "cpu" or len(fields) < 9:
        return None
    ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal (guest is inside user)
    return ticks[7], sum(ticks)


def steal_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of all CPUs' time between two readings that was stolen (0.05: 5 %), or None if unknown."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def since_start() -> str:
    """The steal share since this module was imported (the bench's start), as the machine line prints it."""
    share = steal_share(START, cpu_jiffies())
    return "n/a" if share is None else f"{100 * share:.1f} %"


START = cpu_jiffies()
