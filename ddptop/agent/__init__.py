"""The node agent: the process beside the ranks that outlives them (see :mod:`ddptop.agent.node`)."""
