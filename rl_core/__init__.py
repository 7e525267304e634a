"""rlfoundry package."""
