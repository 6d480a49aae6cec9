"""The app's screens, one module each: the set-up (``setup``, with its estimate of a run's
time and memory in ``setup_estimate``), a run live or followed from its record (``run``), the
history of runs (``history``), a comparison (``compare``), a sweep (``sweep``), the plan on
devices the machine lacks (``plan``), and the modal dialogs (``dialogs``). Screens post
messages to the app and show what they are told."""
