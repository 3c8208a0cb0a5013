"""``tailsight explain``: the report's data (:mod:`.model`), the detection and attribution that
build it (:mod:`.pipeline`) and its two presenters, words for a terminal and ``--json``
(:mod:`.text`) and a self-contained HTML page (:mod:`.html`)."""
