"""A task's life outside a held claim: create and list (``tasks``, ``task_list``), results,
the event log and its replay slots, review, dependencies and the releaser, cancel cascades, the
promoter of DELAYED tasks and the deadline enforcer (``due_index`` under both), and RetryTask
of dead letters (``retry_task``)."""
