"""Teams that would wait for their helpers (``cgru/_kernels/parallel.h``); the results stay
bitwise those of any other team size.

* Held up by other processes: a team whose helper starts late — it shared its core with a
  busy process — makes the next teams smaller for a while, so that a loaded machine does not
  make a 2-thread call wait a scheduler time slice at every region.  The backoff is opt-in
  (``CGRU_TEAMS_BACKOFF=1``); these tests turn it on.
* Cold teams: a team whose threads have slept since the last one (none ended within the last
  0.2 ms) waits for them to wake, and a region ends at a barrier, so where waking them takes
  longer than the region's work would take its caller alone (milliseconds on a virtual
  machine whose idle CPU the host descheduled), the region runs on its caller alone.  Every
  cold team measures how late its helpers start; one skipped region in 16 (then 32, … while
  they stay slow) still gets its team, to measure again.  The rule is off in the rest of the
  suite (``CGRU_COLD_TEAMS=0``, conftest); these tests turn it on and set its state, so
  nothing here depends on how fast this machine wakes a thread."""
import os
import subprocess
import sys

import numpy as np
import pytest

import cgru
from cgru._kernels import threads

pytestmark = pytest.mark.skipif(
    not threads.parallel_enabled() or threads.parallel_info()["cores"] < 2,
    reason="needs OpenMP teams and 2 usable cores")


@pytest.fixture
def backoff():
    old = threads._set_backoff(teams_always=False, reset=True)
    yield
    threads._set_backoff(teams_always=old, reset=True)


def _problem():
    # one time loop with a team (batch 1, H = 256) and a column-split input projection
    net = cgru.Network.random(cgru.Topology(64, 256), np.float32, seed=1)
    x = np.random.default_rng(2).standard_normal((40, 1, 64)).astype(np.float32)
    return net, x


def _teams():
    return threads._counters()["teams"]


def test_a_held_up_team_makes_the_next_teams_smaller(backoff):
    net, x = _problem()
    want = cgru.forward(net, x, num_threads=1)
    before, held = _teams(), threads._backoff()["held_ups"]
    threads._set_backoff(held_up=True)                 # as if its helper had started late
    first = cgru.forward(net, x, num_threads=2)
    assert _teams() > before                           # that call still ran its teams
    assert threads._backoff()["held_ups"] == held + 1
    assert threads._backoff()["backing_off"]
    before = _teams()
    second = cgru.forward(net, x, num_threads=2)
    assert _teams() == before, "a team ran while backing off (2 cores: teams of one)"
    threads._set_backoff(reset=True)
    third = cgru.forward(net, x, num_threads=2)
    assert _teams() > before, "no team after the backoff ended"
    for got in (first, second, third):
        np.testing.assert_array_equal(got.y, want.y)
        np.testing.assert_array_equal(got.hy, want.hy)


def test_the_backoff_is_opt_in(backoff):
    net, x = _problem()
    threads._set_backoff(teams_always=True)
    threads._set_backoff(held_up=True)
    cgru.forward(net, x, num_threads=2)
    before = _teams()
    cgru.forward(net, x, num_threads=2)
    assert _teams() > before
    code = ("from cgru._kernels import threads; "
            "print(threads._backoff()['teams_always'])")
    for value, want in (("1", "False"), ("0", "True"), (None, "True")):
        env = {k: v for k, v in os.environ.items() if k != "CGRU_TEAMS_BACKOFF"}
        if value is not None:
            env["CGRU_TEAMS_BACKOFF"] = value
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=env, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == want, (value, out.stdout, out.stderr)


def test_busy_processes_on_every_core_are_noticed(backoff):
    """With a busy process on every usable core, a 2-thread batch-1 call's helpers start late
    (they wait for a core): within a bounded number of calls a team is found held up, and the
    results stay those of one thread.  Counts events; nothing is timed."""
    net, x = _problem()
    want = cgru.forward(net, x, num_threads=1)
    cores = threads.parallel_info()["cores"]
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(cores)]
    try:
        held = threads._backoff()["held_ups"]
        for _ in range(400):
            got = cgru.forward(net, x, num_threads=2)
            np.testing.assert_array_equal(got.y, want.y)
            if threads._backoff()["held_ups"] > held:
                break
        assert threads._backoff()["held_ups"] > held, "no held-up team in 400 calls"
    finally:
        for p in busy:
            p.kill()
        for p in busy:
            p.wait(timeout=30)


# --- cold teams ---------------------------------------------------------------------------
SLOW = 10 ** 9                  # as if a sleeping helper took a second to wake
PROBE = 16                      # one skipped region in this many gets its team


@pytest.fixture
def cold():
    """The rule on; restored (off, as in the rest of the suite) afterwards."""
    old = threads._cold(rule=True, reset=True)
    yield
    threads._cold(rule=old["rule"], late_ns=old["late_ns"], reset=True)


def _same(got, want):
    np.testing.assert_array_equal(got.y, want.y)
    np.testing.assert_array_equal(got.hy, want.hy)


def test_a_cold_call_shorter_than_a_wake_up_runs_on_its_caller(cold):
    net, x = _problem()
    want = cgru.forward(net, x, num_threads=1)
    threads._cold(late_ns=SLOW, warm=False)
    before, alone = _teams(), threads._cold()["alone"]
    threads._reset_busy_peak()
    got = cgru.forward(net, x, num_threads=2)
    assert _teams() == before, "a team was woken for less work than its waking takes"
    assert threads._cold()["alone"] >= alone + 2        # the projection's and the loop's
    assert threads._counters()["busy_peak"] == 1        # the other core left to other callers
    _same(got, want)


def test_warm_teams_and_long_work_keep_their_teams(cold):
    """Right after a team (its threads still spinning) a call gets its team whatever the
    estimate; a cold region gets one when its work outlasts the estimated wake-up.  (Only the
    first region of each call is asserted: how cold the next one is depends on the time
    between them.)"""
    net, x = _problem()
    want = cgru.forward(net, x, num_threads=1)
    threads._cold(late_ns=SLOW, warm=True)              # as if a team had just ended
    before = _teams()
    _same(cgru.forward(net, x, num_threads=2), want)
    assert _teams() >= before + 1
    threads._cold(late_ns=1, warm=False)                # cold, but waking takes 1 ns
    before = _teams()
    _same(cgru.forward(net, x, num_threads=2), want)
    assert _teams() >= before + 1


def test_skipped_regions_still_measure_now_and_then(cold):
    """One cold region in PROBE gets its team while they are skipped; what it measures moves
    the estimate (a quarter of the way), so a machine that wakes threads quickly again gets
    its teams back.  Each call here is one region: a comparison of two 1 MiB arrays shared by
    two threads."""
    from cgru._kernels import loops
    a = np.arange(1 << 18, dtype=np.float32)
    b = a.copy()
    threads._cold(warm=True)
    assert loops.same_bytes(a, b, num_threads=2)        # the runtime's threads started (a
    threads._cold(late_ns=SLOW, warm=False, reset=True)  # pool's first team is not measured)
    before, alone = _teams(), threads._cold()["alone"]
    calls = 0
    while _teams() == before:
        assert loops.same_bytes(a, b, num_threads=2)
        threads._cold(warm=False)
        calls += 1
        assert calls <= PROBE, "no cold team in PROBE cold regions"
    state = threads._cold()
    assert (calls, state["alone"] - alone) == (PROBE, PROBE - 1)
    assert state["late_ns"] < SLOW, "the probe did not move the estimate"
    assert state["skipped"] == 0


def test_probes_come_less_often_while_waking_stays_slow(cold):
    """A probe whose helpers were later than its work doubles the count of skipped regions
    before the next probe (16, 32, … up to 1024), so that a machine whose wake-ups stay slow
    pays for one in fewer cold regions; one that was not resets it to 16.  Each measured team
    moves the estimate a quarter of the way.  (The state machine driven directly: a real slow
    wake-up cannot be made to order.)  Then the real path: with the count at 32, the 32nd
    cold region gets its team."""
    threads._cold(late_ns=0, reset=True)
    counts = [threads._cold_measured(4000, 1000.0)["probe"] for _ in range(8)]
    assert counts == [32, 64, 128, 256, 512, 1024, 1024, 1024]
    state = threads._cold_measured(500, 1000.0)           # quick again: back to 16
    assert (state["probe"], state["skipped"]) == (PROBE, 0)
    threads._cold(late_ns=1000, reset=True)
    assert threads._cold_measured(5000, 0.0)["late_ns"] == 2000      # a quarter of the way
    assert threads._cold()["probe"] == PROBE                         # no work given: no doubling

    from cgru._kernels import loops
    a = np.arange(1 << 18, dtype=np.float32)
    b = a.copy()
    threads._cold(warm=True)
    assert loops.same_bytes(a, b, num_threads=2)        # the runtime's threads started
    threads._cold(late_ns=SLOW, warm=False, reset=True)
    threads._cold_measured(SLOW, 1000.0)                # a slow probe: 32 from now on
    threads._cold(late_ns=SLOW)
    before, calls = _teams(), 0
    while _teams() == before:
        assert loops.same_bytes(a, b, num_threads=2)
        threads._cold(warm=False)
        calls += 1
        assert calls <= 2 * PROBE, "no cold team in 32 cold regions"
    assert calls == 2 * PROBE


def test_calls_in_a_row_add_up_to_a_wake_up(cold):
    """Cold regions run alone one right after another (a loop of short calls after a pause)
    add up their work; once it is eight estimated wake-ups the team is woken (and then stays
    warm).  Here each call is one region of a known estimate (a pass over 2 MiB: 2^21/16 ns),
    the wake-up is estimated at just over one of them and probes are off: the ninth call in a
    row gets the team.  A pause longer than 0.2 ms between two calls (a loaded machine) starts
    the count again, so the loop allows for some."""
    from cgru._kernels import loops
    a = np.arange(1 << 18, dtype=np.float32)
    b = a.copy()
    threads._cold(warm=True)
    assert loops.same_bytes(a, b, num_threads=2)        # the runtime's threads started
    per = (2 << 20) / 16
    threads._cold(late_ns=int(per) + 1, warm=False, probe=10 ** 9)
    before, alone = _teams(), threads._cold()["alone"]
    for calls in range(1, 201):
        assert loops.same_bytes(a, b, num_threads=2)
        if _teams() > before:
            break
    assert _teams() == before + 1, "200 calls in a row never woke the team"
    assert calls >= 9 and threads._cold()["alone"] - alone == calls - 1


def test_the_rule_is_on_by_default_and_can_be_turned_off():
    code = ("from cgru._kernels import threads; print(threads._cold()['rule'])")
    env = {k: v for k, v in os.environ.items() if k != "CGRU_COLD_TEAMS"}
    on = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                        timeout=120, check=True)
    off = subprocess.run([sys.executable, "-c", code], env={**env, "CGRU_COLD_TEAMS": "0"},
                         capture_output=True, text=True, timeout=120, check=True)
    assert (on.stdout.strip(), off.stdout.strip()) == ("True", "False")
