"""Words and pictures: text, HTML and JSON reports, and plots."""
