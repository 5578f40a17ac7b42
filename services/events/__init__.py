"""The impression and feedback streams: answers logged as they are served, feedback
attributed to them with a trust level."""
