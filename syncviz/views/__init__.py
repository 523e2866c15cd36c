"""Views of a recorded run for people: the terminal summary, strategy comparison, and exports
(TensorBoard, Perfetto, HTML). Views lay out what analysis computes; they compute no metric."""
