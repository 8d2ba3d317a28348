"""The request core: requests, their queues, the scheduler and its plain step plan."""
