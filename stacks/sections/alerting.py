"""`alerting`: where Alertmanager sends alerts, by severity."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from stacks.sections.common import Model, Name


class SecretKey(Model):
    """A key of a Secret in the monitoring namespace, created by the operator
    (`kubectl -n monitoring create secret generic NAME --from-literal=KEY=...`)."""

    secret: Name = Field(description="Secret name (in monitoring.namespace)")
    key: str = Field(pattern=r"^[-._a-zA-Z0-9]+$", description="key within the Secret")


class WebhookReceiver(Model):
    url: SecretKey = Field(description="Secret key holding the URL that receives Alertmanager's webhook JSON")


class FeishuReceiver(Model):
    """A Feishu (Lark) group bot: its webhook URL, and its signing secret when the bot has
    signature verification on."""

    webhook: SecretKey = Field(description="Secret key holding the bot's webhook URL (.../open-apis/bot/v2/hook/...)")
    signing_key: SecretKey | None = Field(None, description="Secret key holding the bot's signing secret")


class EmailReceiver(Model):
    to: list[Annotated[str, Field(pattern=r"^[^@\s]+@[^@\s]+$")]] = Field(min_length=1, description="recipients")
    sender: str = Field(pattern=r"^[^@\s]+@[^@\s]+$", description="From address")
    smarthost: str = Field(pattern=r"^[A-Za-z0-9.-]+:[0-9]{1,5}$", description="SMTP server as host:port")
    username: str | None = Field(None, min_length=1, description="SMTP login; none when unset")
    password: SecretKey | None = Field(None, description="Secret key holding the SMTP password")
    require_tls: bool = Field(True, description="require STARTTLS")

    @model_validator(mode="after")
    def _login(self):
        if (self.username is None) != (self.password is None):
            raise ValueError("password: username and password go together; set both, or neither")
        return self


class ReceiverSettings(Model):
    webhook: WebhookReceiver | None = Field(None, description="a generic webhook (Alertmanager's JSON)")
    feishu: FeishuReceiver | None = Field(None, description="a Feishu/Lark group bot")
    email: EmailReceiver | None = Field(None, description="e-mail through an SMTP server")

    @model_validator(mode="after")
    def _one(self):
        if sum(x is not None for x in (self.webhook, self.feishu, self.email)) != 1:
            raise ValueError("webhook: expected exactly one of webhook, feishu or email")
        return self


class AlertingSettings(Model):
    """Where Alertmanager sends alerts. Routing is by severity: `critical` (users hurt now,
    page) and `warning` (look in working hours) each name the receivers they go to."""

    receivers: dict[Name, ReceiverSettings] = Field(default_factory=dict, description="receivers by name")
    critical: list[Name] = Field(default_factory=list, description="receivers of critical alerts (the pager)")
    warning: list[Name] = Field(default_factory=list, description="receivers of warnings (never a pager)")
    critical_repeat_minutes: int = Field(60, ge=5, le=1440, description="re-notify a firing critical this often")
    warning_repeat_minutes: int = Field(720, ge=30, le=10080, description="re-notify a firing warning this often")
    watchdog: Name | None = Field(
        None, description="receiver of kube-prometheus-stack's always-firing Watchdog: a dead man's switch service "
        "that alerts a person when it stops arriving (none: the Watchdog goes nowhere)",
    )
    watchdog_repeat_minutes: int = Field(5, ge=1, le=60, description="send the Watchdog this often")

    @model_validator(mode="after")
    def _known(self):
        if self.watchdog is not None and self.watchdog not in self.receivers:
            known = ", ".join(self.receivers) or "none defined"
            raise ValueError(f"watchdog: {self.watchdog!r} is not a receiver; expected one of {known}")
        for sev in ("critical", "warning"):
            for i, name in enumerate(getattr(self, sev)):
                if name not in self.receivers:
                    known = ", ".join(self.receivers) or "none defined"
                    raise ValueError(f"{sev}[{i}]: {name!r} is not a receiver; expected one of {known}")
            if len(set(getattr(self, sev))) != len(getattr(self, sev)):
                raise ValueError(f"{sev}: expected distinct receivers")
        return self
