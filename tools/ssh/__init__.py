"""SSH transport (paramiko): one connection per host, concurrent channels, faults survived.

What it does, and why (measured on loopback with OpenSSH 9.2 and paramiko 5.1):

* ``TCP_NODELAY`` on the socket: a default ``exec_command`` of ``true`` costs ~44 ms
  because Nagle's algorithm meets delayed ACKs; with NODELAY it costs ~2.6 ms.
* At most ``max_channels`` (8) sessions at once: OpenSSH's default ``MaxSessions 10``
  refuses the 11th channel.
* stdout and stderr are read together, and before the exit status: reading one stream,
  or waiting for the exit status first, deadlocks once a stream fills the window.
* Commands run in pooled shell sessions (tools/session.py): a long-lived ``bash`` per
  channel takes one framed command at a time, so a command costs a subshell instead of
  sshd's fork, session set-up and shell start (``true``: ~0.8 ms instead of ~3 ms; a login
  shell's rc files are read once per session, not per command). Where the host has no
  bash, each command gets its own ``exec`` channel, as ``ssh host cmd`` would.
* A command cut at its timeout is really ended on the host: its session's process group
  is killed and the session is never reused; output is decoded with replacement
  characters, never a crash.
* Every channel is closed explicitly (paramiko's threaded ``exec_command`` race).
* paramiko's own re-key after 512 MiB stalled and killed the connection: its threshold is
  raised, and the connection is renewed between commands after ``renew_after`` bytes.
* paramiko's keepalive does not notice a hung peer: before a command on a connection that
  has been idle, a cheap ``true`` with a short timeout checks it.
* A dropped connection is re-made with backoff and a read-only command is retried; the
  caller hears about it through ``on_event`` (the transcript says so).
* Host keys are checked against known_hosts as OpenSSH checks them (tools/known_hosts.py:
  patterns, negations, hashed names, ``[host]:port``, ``@revoked``, ``@cert-authority``);
  unknown keys are refused unless ``accept_new`` (OpenSSH's accept-new: one line appended
  under a lock, nothing rewritten); a changed or revoked key is always refused.

* paramiko's transport thread logs its own failures with a traceback (``Exception (client):
  Error reading SSH protocol banner``) through Python's logging, whose last-resort handler prints
  it on stderr: the ``paramiko`` logger is given a handler of its own that drops them, since every
  failure reaches the user once, translated (``exceptions.translate``), with its fix.

The package, by concern: ``config`` (``--host`` to host, port, user, keys, ProxyJump),
``exceptions`` (paramiko's exceptions translated in one place, ``translate``), ``hostkeys``
(known_hosts policy, the paramiko Transport), ``pipe`` (channel buffers, shell sessions) and
``transport`` (``SSHTransport``).
"""

import logging

from .config import resolve
from .exceptions import EXCEPTION_MAP, FIXES, HostKeyRefused, host_key_error, translate
from .hostkeys import Policy, fast_transport
from .pipe import ChunkPipe, Shell, ShellEnded, ShellUnusable, watch
from .transport import SSHTransport

_paramiko_log = logging.getLogger("paramiko")
_paramiko_log.addHandler(logging.NullHandler())
_paramiko_log.propagate = False

__all__ = ["EXCEPTION_MAP", "FIXES", "ChunkPipe", "HostKeyRefused", "Policy", "SSHTransport", "Shell", "ShellEnded",
           "ShellUnusable", "fast_transport", "host_key_error", "resolve", "translate", "watch"]
