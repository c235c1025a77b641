"""`free_port`: the ports the local stack wires its components to before they bind them."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from relayrl import net
from relayrl.net import free_port


def test_a_port_is_never_handed_out_twice_even_once_it_is_free_again():
    # The stack picks an engine's port, then its rollout's, before the engine (still importing
    # torch) binds the first: both were once the same port (the engine died on "Address already in use").
    ports = [free_port() for _ in range(2000)]
    assert len(set(ports)) == len(ports)


def test_ports_stay_out_of_the_range_the_kernel_takes_ports_from():
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(200)]
    assert all(1024 < port < low for port in ports)


def test_a_port_something_listens_on_is_skipped():
    taken = free_port()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", taken + 1))
        listener.listen()
        assert taken + 1 not in {free_port() for _ in range(5)}


def test_a_forked_child_picks_ports_apart_from_its_parent():
    read, write = os.pipe()
    first_in_parent = free_port()
    pid = os.fork()
    if pid == 0:
        os.write(write, str(free_port()).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    in_child = int(os.read(read, 16))
    assert in_child not in {first_in_parent, free_port()}


def test_walks_at_the_same_place_hand_out_different_ports():
    # Two pytest-xdist workers walking the same ports could both find one free before either bound
    # it (paramsync then died on "Failed to bind"). The claims they share are files, so two walks of
    # one process, set to start at the same port, stand for two processes.
    first, second = net._PortWalk(), net._PortWalk()
    second._next = first._next
    ours = [first.take("127.0.0.1") for _ in range(5)]
    theirs = [second.take("127.0.0.1") for _ in range(5)]
    assert not set(ours) & set(theirs)
