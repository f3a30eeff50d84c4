"""Campaigns: studies × datasets × seeds and the claims to check, written as data and run by the platform.

A campaign file (:mod:`study.campaign.spec`, schema in ``docs/campaigns.md``) names its study files, the datasets
each runs on, the seeds and the claims. ``python -m study.campaign CAMPAIGN.yaml`` (:mod:`study.campaign.command`)
runs every study through ``study.sweep``, resumably (:mod:`study.campaign.runner`), keeps their compact records
beside the campaign, and rewrites the generated part of the campaign's page (:mod:`study.campaign.page`); the
verdicts follow :mod:`study.analysis.claims`.
"""
