"""The debugagent agent: symptom parsing, the playbook engine, the LangGraph graph, the CLI."""

__version__ = "0.1.0"
