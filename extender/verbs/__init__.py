"""What each verb decides: filter, prioritize (`scoring/`), bind, preempt, group members' placement, and what
they share (the topology wait, drains, the answer memos, metrics), behind one object (`service.ExtenderService`).
Imports `groups`, `cache`, `kube`, `api` and `topology`; nothing here knows HTTP."""
