"""What can go wrong, by who has to act: the error taxonomy every layer raises from.

Callers catch a base, never a list of leaves (the command line maps each base to one
exit code):

* :class:`UsageError`: the input is wrong (an argument, a setting, a scenario, a
  report, a resource name, a database without the schema). The message names the
  value and says what to give instead; retrying the same input cannot help.
* :class:`Unavailable`: a service the work needs cannot be used right now (the Kafka
  broker, a topic, the database, a Kubernetes API server). The message names the
  address and what to check; the same input may work once the service is back.
* :class:`AccessDenied`, a kind of :class:`Unavailable`: the service is there but turns
  this client away: it refused the credentials, or they lack a permission. The
  message names who was refused what and how to grant it; retrying cannot help until
  someone does, so services that ride out an outage stop on it instead.

Everything else is a defect or a condition handled where it arises.
"""

from __future__ import annotations


class SvledgerError(Exception):
    """The base of the errors svledger raises for a user to act on."""


class UsageError(SvledgerError, ValueError):
    """The input is wrong; the message names the value and what to give instead."""


class Unavailable(SvledgerError, ConnectionError):
    """A service is unreachable or not set up; the message names it and what to check."""

    #: A thread may still wait for the service's answer, so the command must end without
    #: joining it (``os._exit``), as a stopping service that gave up waiting does.
    leaves_a_thread_waiting: bool = False


class AccessDenied(Unavailable):
    """A service refused these credentials or this operation; the message says how to grant it."""
